"""The sandbox: static checks, compilation and isolated evaluation of candidate HGEMM kernels.

(The threat model is written out in cudal2/sandbox/runner.py, where it is enforced.)
"""
