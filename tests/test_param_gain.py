"""benchmarks/param_gain.py: configs paired with their twins that differ only in one parameter, gains per shape."""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cudal2.kernels.sm80 import Reduce, Sm80Family
from cudal2.kernels.small import SmallFamily
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import Mode, Task
from cudal2.tune_log import ConfigRecord, TuneLog
from tests.sandbox.test_store import failed_result, ok_result

H100 = "NVIDIA H100 80GB HBM3 (sm_90a)"
SMALL, SM80 = SmallFamily(), Sm80Family()
PULLED = replace(SMALL.default(), bm=16, bn=16, warps_n=1, warps_k=4, cluster_k=4)
PUSHED = replace(PULLED, push=True)
T1, T2, T3 = Task(64, 64, 1024), Task(64, 64, 4096), Task(1024, 1024, 1024)


@pytest.fixture(scope="module")
def param_gain():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("param_gain")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """PULLED and PUSHED timed on T1 (4 us / 2 us) and T2 (6 / 4, then PUSHED again: failed, so no figure); T3 only
    pushed. An sm80 cluster config with its workspace twin; an unpaired sm80 push config."""
    path = tmp_path / "s.sqlite"
    sm80_cluster = replace(SM80.default(), split_k=4, reduce=Reduce.CLUSTER)
    with ResultStore(path) as s, TuneLog(s) as log:
        for h, family, cfg, times in (("pulled", SMALL, PULLED, {T1: 4.0, T2: 6.0}),
                                      ("pushed", SMALL, PUSHED, {T1: 2.0, T2: 4.0, T3: 1.0}),
                                      ("cluster", SM80, sm80_cluster, {T1: 3.0}),
                                      ("workspace", SM80, replace(sm80_cluster, reduce=Reduce.WORKSPACE), {T1: 6.0}),
                                      ("lonely", SM80, replace(sm80_cluster, reduce=Reduce.PUSH, stages=3), {T1: 1.0})):
            log.put_config(h, ConfigRecord.of(family, cfg))
            s.put_source(h, f"// {h}")
            for task, us in times.items():
                s.put_result(h, H100, Mode.OFFLINE, ok_result(task, us))
        s.put_result("pushed", H100, Mode.OFFLINE, failed_result(T2))  # newer than its ok figure: T2 has none now
        s.put_result("pulled", H100, Mode.SERVER, ok_result(T3, 9.0))  # not offline: never paired
    return path


def test_each_config_pairs_with_its_twin_on_the_shapes_both_have(param_gain, db):
    (pair,) = param_gain.pairs_for(db, H100, SMALL, "push", True, False, {T1, T2, T3})
    assert pair.config.endswith("-cluster_k4-push1") and pair.twin == pair.config[:-len("-push1")]
    assert pair.gains == {T1: 2.0}  # T2: the pushed config's newest result failed; T3: the twin has no offline figure
    (sm80,) = param_gain.pairs_for(db, H100, SM80, "reduce", Reduce.CLUSTER, Reduce.WORKSPACE, {T1})
    assert sm80.gains == {T1: 2.0} and sm80.config.endswith("reducecluster")
    assert param_gain.pairs_for(db, H100, SM80, "reduce", Reduce.PUSH, Reduce.CLUSTER, {T1}) == []  # no twin stored


def test_values_are_read_as_config_names_print_them(param_gain):
    assert param_gain.parse_value(SMALL, "push", "1") is True and param_gain.parse_value(SMALL, "push", "0") is False
    assert param_gain.parse_value(SM80, "reduce", "push") is Reduce.PUSH
    assert param_gain.parse_value(SM80, "split_k", "16") == 16
    with pytest.raises(param_gain.ParamError, match="reduce='pull' is not one of its values"):
        param_gain.parse_value(SM80, "reduce", "pull")


def test_cli_prints_the_pairs_and_refuses_bad_input_in_one_line(param_gain, db, tmp_path, capsys):
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,acc,split,source\n64,64,1024,fp32,train,t\n64,64,4096,fp32,train,t\n")
    args = ["--db", str(db), "--shapes", str(shapes), "--gpu", "h100"]
    assert param_gain.main([*args, "--param", "push"]) == 0
    out = capsys.readouterr().out
    assert "small on NVIDIA H100 80GB HBM3 (sm_90a): push = 1 against 0" in out
    assert "| 1 | 2.000 | 2.00-2.00 | 1 |" in out and "fastest twin / fastest config over 1 shapes: geomean 2.000" in out
    assert param_gain.main([*args, "--param", "reduce", "--value", "push", "--base", "cluster"]) == 1
    err = capsys.readouterr().err
    assert "no config with reduce = push has a twin" in err and len(err.strip().splitlines()) == 1
    # "lonely" has reduce = push but its twin (reduce = cluster, stages 3) was never recorded: the line says so.
    assert "sm80_mma: 1 with it recorded, none of their twins (reduce = cluster)" in err
    assert param_gain.main([*args, "--param", "stages", "--value", "2"]) == 1
    assert "(sm80_mma: none with it is recorded)" in capsys.readouterr().err
    for bad in (["--param", "nonsense"], ["--param", "reduce", "--value", "pull"], ["--param", "push", "--gpu", "a100"]):
        assert param_gain.main([*args, *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("param_gain.py: ") and len(err.strip().splitlines()) == 1
