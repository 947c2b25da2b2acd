"""CLI behaviour on a CPU machine: exit codes, one-line errors, --json schema, compile-only evaluation."""

from __future__ import annotations

import json

import pytest

from cudal2 import cli
from tests.sandbox.corpus import KERNELS

SEED = str(KERNELS / "seed" / "naive.cu")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDAL2_NO_GPU", "1")  # the CPU path, also when a GPU happens to be present


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.nvcc
def test_compile_only_json_schema(capsys, tmp_path):
    code, out, _ = run(capsys, "eval", SEED, "--mnk", "64_4096_64", "--mnk", "128x128x256", "--compile-only",
                       "--json", "--db", str(tmp_path / "r.sqlite"))
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["mnk"] for r in rows] == ["64_4096_64", "128_128_256"]
    for r in rows:
        assert r["file"] == SEED and r["status"] == "compiled" and "sm_90a" in r["reason"]


@pytest.mark.nvcc
def test_compile_error_exits_1_with_reason(capsys, tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('#include <cuda_fp16.h>\nextern "C" int cudal2_hgemm(const half* A, const half* B, half* C, '
                   "int M, int N, int K, void* w, size_t wb, cudaStream_t s) { return undefined_thing; }\n")
    code, out, _ = run(capsys, "eval", str(bad), "--mnk", "64_64_64", "--compile-only", "--json",
                       "--db", str(tmp_path / "r.sqlite"))
    assert code == 1
    row = json.loads(out)
    assert row["status"] == "compile_error" and row["reason"]


def test_static_reject_exits_1(capsys, tmp_path):
    bad = tmp_path / "forks.cu"
    bad.write_text('extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, '
                   "void* w, size_t wb, cudaStream_t s) { fork(); return 0; }\n")
    code, out, _ = run(capsys, "eval", str(bad), "--mnk", "64_64_64", "--compile-only", "--json",
                       "--db", str(tmp_path / "r.sqlite"))
    assert code == 1
    assert json.loads(out)["status"] == "static_reject"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", SEED, "--mnk", "64_64"], "bad shape"),
        (["eval", SEED, "--mnk", "0_64_64"], "M=0"),
        (["eval", "/no/such/file.cu", "--mnk", "64_64_64", "--compile-only"], "no such file"),
        (["eval", SEED, "--mnk", "64_64_64"], "no CUDA GPU"),  # beyond --compile-only without a GPU
        (["baseline", "--mnk", "64_64_64"], "no CUDA GPU"),
    ],
)
def test_bad_usage_one_line_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_corrupt_db_is_one_line_error_and_file_untouched(capsys, tmp_path):
    db = tmp_path / "r.sqlite"
    db.write_bytes(b"not a database at all" * 100)
    before = db.read_bytes()
    code, _, err = run(capsys, "eval", SEED, "--mnk", "64_64_64", "--compile-only", "--db", str(db))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert db.read_bytes() == before


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "cudal2: error: the following arguments are required: command"),
        (["eval"], "cudal2 eval: error: the following arguments are required"),
        (["eval", SEED, "--mnk", "64_64_64", "--mode", "bogus"], "cudal2 eval: error: argument --mode: invalid choice"),
        (["tune", "--mnk", "64_64_64", "--max-configs", "abc"], "cudal2 tune: error: argument --max-configs"),
        (["tune", "--mnk", "64_64_64", "--retry", "ok"], "cudal2 tune: error: argument --retry: invalid choice"),
        (["pool", "bogus"], "cudal2 pool: error: argument pool_command: invalid choice"),
    ],
)
def test_argparse_errors_are_one_line_and_exit_2(capsys, argv, message):
    """Not argparse's usage block: the line that says what was wrong, and where the usage is."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(message) and "--help)" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("argv", "field", "expected"),
    [
        (["tune", "--mnk", "64_64_64", "--strategy", "given", "--configs", "a.txt", "--configs", "b.txt", "c.txt"],
         "configs", ["a.txt", "b.txt", "c.txt"]),
        (["store", "assemble", "s.sqlite.gz", "--out", "o.sqlite", "--also", "a.gz", "b.gz", "--also", "c.gz"],
         "also", ["a.gz", "b.gz", "c.gz"]),
    ],
)
def test_a_repeated_list_flag_adds_to_the_list(argv, field, expected):
    """`--also A --also B` used to keep only B (argparse's default for nargs="+" is to replace): a user who named two
    stores or config files got one, with no word said. Each flag now adds its items, in order."""
    assert getattr(cli.build_parser().parse_args(argv), field) == expected


def test_explain_shapes_and_a_models_layers_from_a_library(capsys, tmp_path):
    """The dispatch rule on a library's manifest, as on its GPU, without one: per shape, and per model layer."""
    from tests.library_fixtures import entry, manifest, write_fixture_library

    lib = write_fixture_library(tmp_path / "lib", manifest(
        entry(128, 4096, 4096, median_us=100.0, torch_us=200.0),  # Llama-3-8B's q/o at M = 128: 2x
        entry(1, 1024, 4096, median_us=5.0, torch_us=6.0),  # its k/v at M = 1: saves 1 us, less than a bias add
    ))
    code, out, _ = run(capsys, "explain", "--library", str(lib), "--mnk", "128_4096_4096", "--mnk", "1x1024x4096",
                       "--bias")
    assert code == 0
    assert "128_4096_4096 -> cudal2 kernel: kernel 128_4096_4096.cu: 100.0 us vs torch.matmul" in out
    assert "with the bias added after it" in out
    assert "1_1024_4096 -> torch.matmul: with a bias: the kernel saves 1.0 us" in out
    code, out, _ = run(capsys, "explain", "--library", str(lib), "--model", "Llama-3-8B", "--tokens", "1,128")
    assert code == 0
    saved = 2 * 100.0  # q_proj and o_proj at M = 128
    assert f"| 128 | exact 2.00x | torch | torch | exact 2.00x | torch | torch | torch | {saved:.1f} |" in out
    assert "| 1 | torch | exact 1.20x | exact 1.20x | torch | torch | torch | torch | 2.0 |" in out
    code, out, _ = run(capsys, "explain", "--library", str(lib), "--model", "Qwen2.5-0.5B", "--tokens", "16")
    assert "| 16 | torch +b | torch +b | torch +b | torch |" in out  # no kernel for its shapes; biases marked


@pytest.mark.parametrize("argv, message", [
    (["explain", "--library", "LIB"], "name shapes (--mnk M_N_K) or a model (--model NAME)"),
    (["explain", "--library", "LIB", "--mnk", "0_1_1"], "M=0"),
    (["explain", "--library", "LIB", "--model", "Llama-3-8B", "--tokens", "1,x"], "--tokens wants"),
    (["explain", "--library", "LIB", "--mnk", "1_1_1", "--min-speedup", "nan"], "--min-speedup nan"),
    (["explain", "--library", "NOWHERE", "--mnk", "1_1_1"], "no such manifest"),
])
def test_explain_bad_input_is_one_line(capsys, tmp_path, argv, message):
    from tests.library_fixtures import entry, manifest, write_fixture_library

    lib = write_fixture_library(tmp_path / "lib", manifest(entry(64, 64, 64, 1.0, 2.0)))
    argv = [str(lib) if a == "LIB" else str(tmp_path / a) if a == "NOWHERE" else a for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
