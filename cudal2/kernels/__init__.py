"""Generated HGEMM kernel families (see family.py for the interface every family follows)."""
