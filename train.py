"""GRPO training of a kernel-writing policy.

    python train.py --config configs/smoke_cpu.yaml [--key value ...]   (any field below or of GRPOConfig)

    data/grid.csv rows (M, N, K, acc; train split)
      └─► cudal2.policy.prompt: contract + rules + shape + nearest best kernels from the store (or the seed)
            └─► TRL GRPOTrainer: num_generations completions per prompt (transformers generate, or vLLM)
                  └─► cudal2_reward (async): last ```cuda block ─► SandboxPool (static rules, nvcc, harness on a GPU,
                      or compile-only) ─► rubric terms (speed, accuracy, length, status, ptxas), logged per term
                        └─► group-relative advantages ─► policy update (full or LoRA); checkpoints in output_dir
    Every evaluated kernel lands in the result store, so training also grows the knowledge base that later prompts
    retrieve from. The pool runs in worker processes (or is a shared server: --pool_server), so the policy can sit on
    some GPUs and the sandbox on others.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cudal2.data import BadShapeFile, load_shapes
from cudal2.sandbox.evaluator import EvalOptions
from cudal2.sandbox.gpu import detect_gpu
from cudal2.sandbox.types import Mode


@dataclass
class DataArgs:
    shapes: str = "data/grid.csv"  # shape CSV (columns M,N,K,acc,split,source)
    train_split: str = "train"
    eval_split: str = "heldout"
    max_train_shapes: int = 0  # 0 = every shape of the split
    max_eval_shapes: int = 4  # held-out shapes sampled at each periodic evaluation


@dataclass
class PoolArgs:
    pool_backend: str = "local"  # local | ray
    pool_gpus: str = "all"  # GPU indices for the sandbox, comma-separated; "all" or "none"
    # GPUs this trainer process sees (CUDA_VISIBLE_DEVICES), comma-separated; "auto" = the first GPU the pool does
    # not use (GPU 0 when it uses all). Several GPUs for the policy need a launcher (`accelerate launch`), which
    # sets the placement itself; then this is ignored.
    trainer_gpus: str = "auto"
    pool_server: str = ""  # state file of a running `cudal2 pool start` server; "" = start a private pool
    compile_only: bool = False  # no GPU evaluation: reward from compile success and ptxas figures
    db: str = ""  # result store; "" = the default path
    eval_target_ms: float = 50.0  # timing budget per kernel per shape (ms)
    # How the reward times a candidate: offline (CUDA-graph replay; the targets' mode, where a small shape's 32
    # rotating input sets stay in L2) or cold (the same replay after an L2 flush: inputs from DRAM).
    eval_mode: str = "offline"
    heldout_every: int = 0  # steps between held-out evaluations (best-of-n speedup, correctness); 0 = off
    heldout_samples: int = 4  # completions per held-out shape
    resume: bool = False  # continue from the last checkpoint in output_dir


def _gpus(spec: str) -> tuple[int, ...] | None:
    if spec == "all":
        return None
    if spec == "none":
        return ()
    return tuple(int(g) for g in spec.split(",") if g.strip())


def _first_gpu(spec: str) -> int:
    gpus = _gpus(spec)
    return gpus[0] if gpus else 0


def place_trainer(argv: list[str]) -> str | None:
    """Restrict the GPUs this process sees, before torch initialises CUDA; returns what was set (None = unchanged).

    Why: transformers' Trainer wraps the model in nn.DataParallel when one process sees several GPUs, which GRPO
    refuses; and the policy should not sit on the sandbox's GPUs when others are free. The sandbox's workers are
    unaffected: the harness child gets its physical GPU index explicitly (sandbox.runner). Runs before the full
    argument parse (which may touch CUDA), so it reads only --config, --trainer_gpus and --pool_gpus.
    """
    import argparse

    import yaml

    from cudal2.sandbox.gpu import visible_gpus

    if "CUDA_VISIBLE_DEVICES" in os.environ or "LOCAL_RANK" in os.environ:  # the user's or a launcher's placement
        return None
    ap = argparse.ArgumentParser(add_help=False)
    for flag in ("--config", "--trainer_gpus", "--pool_gpus"):
        ap.add_argument(flag)
    known, _ = ap.parse_known_args(argv)
    try:
        cfg = yaml.safe_load(Path(known.config).read_text()) if known.config else {}
    except (OSError, yaml.YAMLError):
        return None  # the full parse reports it
    cfg = cfg if isinstance(cfg, dict) else {}
    trainer = str(known.trainer_gpus or cfg.get("trainer_gpus", "auto"))
    if trainer == "auto":
        visible = [g.index for g in visible_gpus()]
        if len(visible) <= 1:
            return None
        pool = _gpus(str(known.pool_gpus or cfg.get("pool_gpus", "all")))
        free = [g for g in visible if g not in (visible if pool is None else pool)]
        trainer = str((free or visible)[0])
    os.environ["CUDA_VISIBLE_DEVICES"] = trainer
    return trainer


REWARD_MODES = (Mode.OFFLINE, Mode.COLD)  # graph-replayed: device time per call, steady enough for a reward


def reward_mode(args: PoolArgs) -> Mode:
    """The timing mode eval_mode names; ValueError (a one-line error in main) for any other."""
    mode = next((m for m in REWARD_MODES if m.value == args.eval_mode), None)
    if mode is None:
        raise ValueError(f"eval_mode {args.eval_mode!r}: one of {', '.join(m.value for m in REWARD_MODES)}")
    if args.pool_server and mode is not Mode.OFFLINE:
        raise ValueError(f"eval_mode {mode.value} with pool_server: a shared pool times in its own (offline) mode")
    return mode


def make_pool(args: PoolArgs):
    """A SandboxPool (or a client of a shared one) for the reward."""
    from cudal2.sandbox.pool import Backend, PoolConfig, SandboxPool
    from cudal2.sandbox.pool.server import PoolClient

    mode = reward_mode(args)
    if args.pool_server:
        return PoolClient(Path(args.pool_server))
    options = EvalOptions(compile_only=args.compile_only, target_ms=args.eval_target_ms, mode=mode)
    cfg = PoolConfig(backend=Backend(args.pool_backend), gpus=_gpus(args.pool_gpus), db_path=args.db or None,
                     eval=options)
    return SandboxPool(cfg)


def build_prompts(rows, tokenizer, policy_cfg, store, gpu_label: str) -> list[list[dict]]:
    """One chat prompt per shape: contract, rules, shape, and the nearest best kernels from the store."""
    from cudal2.policy.prompt import build_messages, retrieve_examples

    return [build_messages(r.task, policy_cfg.gpu_name, retrieve_examples(store, r.task, gpu_label, policy_cfg.n_examples),
                           tokenizer, policy_cfg.max_prompt_tokens) for r in rows]


def build_dataset(rows, prompts: list[list[dict]]):
    """TRL's conversational format, with the shape columns the reward function receives."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": prompts, "M": [r.M for r in rows], "N": [r.N for r in rows],
                              "K": [r.K for r in rows], "acc": [r.acc for r in rows]})


def prepare_tiny_policy(rows, policy_cfg, store, gpu_label: str) -> None:
    """The tiny local policy is warm-started on the run's own prompts (see cudal2.policy.warm)."""
    from cudal2.policy.model import build_tiny_policy, load_tokenizer
    from cudal2.policy.warm import ensure_warm

    path = build_tiny_policy(policy_cfg.tiny_path)
    tokenizer = load_tokenizer(str(path), True)
    ensure_warm(path, build_prompts(rows[:4], tokenizer, policy_cfg, store, gpu_label))


def parse(argv: list[str]):
    from trl import GRPOConfig, TrlParser

    from cudal2.policy.config import PolicyConfig
    from cudal2.reward.config import RewardConfig

    parser = TrlParser((DataArgs, PoolArgs, PolicyConfig, RewardConfig, GRPOConfig))
    return parser.parse_args_and_config(argv)


def train(data: DataArgs, pool_args: PoolArgs, policy_cfg, reward_cfg, grpo) -> dict:
    """Run GRPO; returns the final metrics. Raises the one-line errors main() prints."""
    from cudal2.policy.model import load_policy
    from cudal2.sandbox.store import ResultStore

    reward_mode(pool_args)  # a bad eval_mode fails before the model loads
    rows = load_shapes(data.shapes, data.train_split)
    if not rows:
        raise BadShapeFile(f"{data.shapes}: no rows in split {data.train_split!r}")
    rows = rows[: data.max_train_shapes] if data.max_train_shapes else rows
    gpu = None if pool_args.compile_only else detect_gpu(_first_gpu(pool_args.pool_gpus))
    gpu_label = gpu.label if gpu else "none"  # the store's label for results of this GPU
    with ResultStore(pool_args.db or None) as store:
        if policy_cfg.is_tiny:
            prepare_tiny_policy(rows, policy_cfg, store, gpu_label)
        model, tokenizer = load_policy(policy_cfg, apply_lora=False)  # TRL applies LoRA through peft_config
        dataset = build_dataset(rows, build_prompts(rows, tokenizer, policy_cfg, store, gpu_label))
    pool = make_pool(pool_args)
    try:
        return _train_with_pool(pool, data, pool_args, policy_cfg, reward_cfg, grpo, model, tokenizer, dataset,
                                gpu_label)
    finally:
        pool.shutdown()


def _train_with_pool(pool, data, pool_args, policy_cfg, reward_cfg, grpo, model, tokenizer, dataset,
                     gpu_label: str) -> dict:
    """The trainer around a running pool (the caller shuts the pool down whatever happens)."""
    from transformers.trainer_utils import get_last_checkpoint

    from cudal2.policy.extract import extract_for_reward
    from cudal2.policy.grpo import TimedGRPOTrainer
    from cudal2.policy.model import lora_config
    from cudal2.reward.trl_adapter import make_reward_function
    from cudal2.sandbox.store import ResultStore

    reward = make_reward_function(pool, reward_cfg, extract_for_reward)
    callbacks = []
    if pool_args.heldout_every > 0:
        from cudal2.policy.heldout import HeldOutEval

        held = load_shapes(data.shapes, data.eval_split)[: data.max_eval_shapes]
        with ResultStore(pool_args.db or None) as store:
            held_prompts = build_prompts(held, tokenizer, policy_cfg, store, gpu_label)
        callbacks.append(HeldOutEval([r.task for r in held], held_prompts, pool, pool_args.heldout_samples,
                                     pool_args.heldout_every, grpo.temperature, policy_cfg.max_completion_tokens))
    grpo.max_completion_length = policy_cfg.max_completion_tokens  # one knob: the policy config's
    rollout = None
    if policy_cfg.turns > 1:
        from cudal2.policy.multiturn import make_rollout

        rollout = make_rollout(pool, policy_cfg.turns, grpo.temperature, policy_cfg.max_completion_tokens)
    trainer = TimedGRPOTrainer(model=model, reward_funcs=[reward], args=grpo, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=lora_config(policy_cfg), callbacks=callbacks,
                          rollout_func=rollout)
    for cb in callbacks:
        cb.trainer = trainer
    resume = get_last_checkpoint(grpo.output_dir) if pool_args.resume and Path(grpo.output_dir).is_dir() else None
    result = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(grpo.output_dir)
    # The run's log in one file (what `cudal2 ablate` compares; tensorboard has the same figures).
    (Path(grpo.output_dir) / "cudal2_run.json").write_text(json.dumps(
        {"metrics": result.metrics, "log_history": trainer.state.log_history}, indent=1))
    return result.metrics


def main(argv: list[str] | None = None) -> int:
    from cudal2.policy.model import PolicyLoadError

    argv = sys.argv[1:] if argv is None else argv
    try:
        place_trainer(argv)
        data, pool_args, policy_cfg, reward_cfg, grpo = parse(argv)
        metrics = train(data, pool_args, policy_cfg, reward_cfg, grpo)
    except (BadShapeFile, PolicyLoadError, FileNotFoundError, ValueError) as e:
        print(f"train.py: error: {e}".splitlines()[0], file=sys.stderr)
        return 2
    except Exception as e:  # a bug or an environment problem: one line, the traceback on request
        if os.environ.get("CUDAL2_DEBUG"):
            raise
        print(f"train.py: internal error: {e!r}".splitlines()[0] + " (CUDAL2_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 2
    print("train.py: done: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in sorted(metrics.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
