"""What the commands share: the one option set (:data:`SHARED_OPTIONS`: every flag two commands
take, declared once, each a :class:`SharedOption`), gathered into one
:class:`agent_shell.run_config.ResolvedRun` (:func:`config_options`, :func:`config_from`), the
console they print on, and the turning of the pipeline's errors (:mod:`agent_shell.pipeline`)
into one-line click errors.

A command takes a shared flag only from here (``tests/agents/test_cli_options.py`` fails on a
second declaration); where it means something narrower the command words the help or sets the
default for itself (:meth:`SharedOption.but`), keeping the flag, destination and type."""

from __future__ import annotations

import contextlib
import functools
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import click

from agent_shell.agents import agent_names
from agent_shell.history import RENDERINGS
from agent_shell.lm.jax_platforms import JaxPlatformError
from agent_shell.lm.protocol import BackboneFault
from agent_shell.configure import resolve
from agent_shell.run_config import ACTION_SPACES, RunConfig
from envs.registry import ENVIRONMENTS
from cb_io.paths import cache_root, writable_folder
from cb_io.records import EPISODE_TIMEOUT_S
from cb_io.storage import OutputError

if TYPE_CHECKING:
    from envs.protocol import Environment

ENV_NAMES = sorted(ENVIRONMENTS)


class SharedClickOption(click.Option):
    """A click option made from the shared set (:class:`SharedOption`): the mark by which a test
    finds every declaration of a shared flag outside it."""


@dataclass(frozen=True)
class SharedOption:
    """One option of the shared set, declared once: its flags, destination, type, default and help
    (``click.option``'s arguments). Applied to a command it adds the option; :meth:`but` gives the
    same option with another help text, default or requirement for one command (its flags,
    destination and type stay the shared ones).

    Attributes:
        decls: the flags and the destination (``click.option``'s positional arguments).
        attrs: ``click.option``'s keyword arguments.
    """

    decls: tuple[str, ...]
    attrs: Mapping[str, Any]

    def __call__(self, fn: Callable) -> Callable:
        return click.option(*self.decls, cls=SharedClickOption, **self.attrs)(fn)

    def but(self, **changes: Any) -> SharedOption:
        """This option with ``changes`` (``help``, ``default``, ``show_default``, ``required``...)."""
        return SharedOption(self.decls, {**self.attrs, **changes})

    @property
    def flags(self) -> tuple[str, ...]:
        """The option's flags (``--resume/--no-resume`` as both)."""
        return tuple(f for d in self.decls if d.startswith("-") for f in d.split("/"))


class Strength(click.ParamType):
    """``--lam``: an L2 strength > 0, or ``auto`` (chosen per task type by cross-validation,
    :func:`cb_core.select_strengths`)."""

    name = "float|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float | str:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is neither a number > 0 nor 'auto'", param, ctx)
        if not (math.isfinite(x) and x > 0):
            self.fail(f"{x} must be > 0 (the fit is strongly convex only then), or 'auto'", param, ctx)
        return x


def fixed_strength(config: RunConfig, what: str) -> float:
    """``config.lam`` where ``what`` needs a number: ``--lam auto`` chooses the concepts' strength,
    so this command refuses it in one line (click.UsageError)."""
    if config.lam == "auto":
        raise click.UsageError(f"--lam auto chooses a concept's strength by cross-validation over expert "
                               f"trajectories; {what} needs a number (e.g. --lam 1.0)")
    return config.lam


def shared(*decls: str, **attrs: Any) -> SharedOption:
    """A :class:`SharedOption` (``click.option``'s arguments)."""
    return SharedOption(decls, attrs)
#: ``--history`` choices.
RENDERING_NAMES = tuple(RENDERINGS)

#: The options of every command that loads a backbone (``config`` field -> :class:`SharedOption`).
COMMON_OPTIONS = {
    "env": shared("--env", "env", type=click.Choice(ENV_NAMES), default="alfworld", show_default=True,
                  help="Benchmark (task ids: `cb-agent tasks --env ENV`)."),
    "model": shared("--model", default=None, help="Backbone name or local path (default: the offline "
                    "SmolLM2-135M-Instruct), or BACKEND:ARG for another LM backend (jax: or jax:PATH for the "
                    "JAX backend, vllm:PATH, or a plug-in; `cb-agent backends` lists them)."),
    "dtype": shared("--dtype", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto",
                    show_default=True, help="Backbone dtype; auto = bfloat16 on a GPU or a CPU with native "
                    "bf16 (avx512_bf16/amx), else float32 (emulated bf16 is several times slower)."),
    "device": shared("--device", default="auto", show_default=True, metavar="auto|KIND[:N|:I-J|:I,J,..|:all]",
                     help="Where the backbone loads (auto = cuda when torch sees a GPU, else cpu; with "
                          "--model jax:, also tpu and gpu: whatever jax.devices() offers, and a mesh of several "
                          "devices the weights are split over: KIND:I-J, KIND:I,J,... or KIND:all, e.g. tpu:all, "
                          "cuda:0-3, or cpu:0-2 with XLA_FLAGS=--xla_force_host_platform_device_count=3; a mesh must "
                          "divide the model's heads). With "
                          "--workers on CUDA the workers share one backbone (--shared-lm)."),
    "demo_split": shared("--demo-split", default="train", show_default=True,
                         help="Split the expert demonstrations come from."),
    "demos_per_type": shared("--demos-per-type", type=click.IntRange(min=1), default=2, show_default=True,
                             help="Won expert trajectories per task type (ReAct demos and concept data)."),
    "rendering": shared("--history", "--rendering", "rendering", type=click.Choice(list(RENDERING_NAMES)),
                        default="raw", show_default=True,
                        help="History rendering, the same for demonstrations, fitting and acting: raw, "
                             "causal (outcome labels), check (re-check reminder), experience (LM review "
                             "calls, NO UPDATE), calibrator (experiences chosen by the learned calibrator, "
                             "--calibrator), and the interventions recent3, obs-only, shuffle-all, "
                             "shuffle-old."),
    "layout": shared("--layout", type=click.Choice(["text", "chat"]), default="text", show_default=True,
                     help="One text prompt, or user/assistant chat messages (chat template)."),
    "lam": shared("--lam", type=Strength(), default=1.0, show_default=True,
                  help="L2 strength of the concept fit (Eq. 6), or auto: per task type by cross-validation "
                       "over the expert trajectories (folds by trajectory, 10 strengths from 10^-2.5 to 10^2; "
                       "1.0 unless a strength beats it on held-out top-1 by more than 2 paired standard errors with "
                       "a held-out log-likelihood no lower)."),
    "gamma": shared("--gamma", type=float, default=0.8, show_default=True,
                    help="Prior length-normalisation exponent (App. B)."),
    "features": shared("--features", default="lm-hidden", show_default=True,
                       help="What the concept sees, comma-separated: lm-hidden (the seed's last-layer state), "
                            "lm-layer:K[:mean] (decoder layer K at the final action token or averaged), "
                            "goal-similarity (MiniLM cosines with the task and the latest observation, "
                            "names in the task), novelty (repeats and their outcomes), or a third-party "
                            "extractor (entry-point group cb_agent.feature_extractors)."),
    "seed": shared("--seed", type=int, default=0, show_default=True,
                   help="Seed of sampled generations and of the shuffle renderings (--history shuffle-all, "
                        "shuffle-old: the concept's contexts read it too)."),
    "fit_candidates": shared("--fit-candidates", type=click.IntRange(min=0), default=0, show_default=True,
                             help="Cap each expert decision's candidate set in the concept's fit at this many "
                                  "(the expert's action and a seeded sample of the others); 0 = no cap. "
                                  "ScienceWorld's ~1,000 valid combinations a state need one (e.g. 64)."),
    "calibrator": shared("--calibrator", type=click.Path(exists=True, dir_okay=False), default=None,
                         help="Fitted calibrator file (`cb-agent calibrate fit`); needed by --history "
                              "calibrator, which shows the experiences it writes."),
    "cache_dir": shared("--cache-dir", type=click.Path(file_okay=False), default=None,
                        help="Cache root for this command: expert trajectories, features, concepts, generated "
                             "TextWorld games and compiled programs (default: $CB_AGENT_CACHE or ~/.cache/cb-agent)."),
}
#: The options of ``cb-agent run`` besides :data:`COMMON_OPTIONS`.
RUN_OPTIONS = {
    "agents": shared("--agent", "agents", type=click.Choice(agent_names()), multiple=True, default=("cb-agent",),
                     show_default=True, help="Agent(s) to run (repeatable; all share one backbone load)."),
    "split": shared("--split", default=None, help="Evaluation split (default: the environment's held-out "
                    "games: alfworld valid_unseen, scienceworld test, textworld test; every --game must belong "
                    "to it; list ids with `cb-agent tasks --env ENV --split SPLIT`)."),
    "per_type": shared("--per-type", type=click.IntRange(min=0), default=1, show_default=True,
                       help="Evaluation games per task type (first in sorted order); 0 = all."),
    "all_games": shared("--all-games", is_flag=True, help="Evaluate the whole split (--per-type 0 --games 0)."),
    "games": shared("--games", type=click.IntRange(min=0), default=2, show_default=True,
                    help="Cap on the number of games after --per-type (the default slice: the first game "
                         "of the first two task types); 0 = no cap."),
    "game_ids": shared("--game", "game_ids", multiple=True, help="Explicit game/task id(s) of --split "
                       "(repeatable; overrides --per-type/--games; checked before anything loads)."),
    "budget": shared("--max-steps", "budget", type=click.IntRange(min=1), default=50, show_default=True,
                     help="Step budget per episode (trial), think steps included."),
    "action_space": shared("--action-space", type=click.Choice(ACTION_SPACES), default="fixed",
                           show_default=True, help="CB-Agent candidates: environment set, or 20 sampled replies."),
    "reflexion_trials": shared("--reflexion-trials", type=click.IntRange(min=2), default=2, show_default=True,
                               help="Trials per episode of the reflexion-* agents (a reflection after each "
                                    "failed trial; success = a won trial)."),
    "keep_errors": shared("--keep-errors", is_flag=True,
                          help="With --resume, keep the episodes an engine fault or the time limit ended "
                               "(error records) instead of playing them again."),
    "out_dir": shared("--out-dir", type=click.Path(file_okay=False), default=None,
                      help="Results folder (default: runs/<env>-<split>; improve: runs/improve-<env>-<split>)."),
    "resume": shared("--resume/--no-resume", default=False, show_default=True,
                     help="Skip episodes already in the results file (after moving a torn last line "
                          "aside; an episode an engine fault or the time limit ended is played again "
                          "unless --keep-errors); without it a file that already holds these episodes "
                          "is refused."),
    "demos": shared("--demos", default="expert", show_default=True,
                    help="ReAct demonstrations: 'expert' (fixed, per task type), 'ical:MEMORY' (the "
                         "--demos-per-type examples retrieved from an ICAL memory for each game's instruction, "
                         "their annotations as thoughts) or 'ical-actions:MEMORY' (the same without annotations)."),
    "concept_per_type": shared("--concept-per-type", type=click.IntRange(min=0), default=0, show_default=True,
                               help="Won expert trajectories per task type that the concept is fitted on "
                                    "(the first of --demo-split, as the demonstrations); 0 = --demos-per-type. "
                                    "The ReAct demonstrations stay --demos-per-type (the scorer sees none)."),
    "concept_data": shared("--concept-data", type=click.Choice(["expert", "ical"]), default="expert",
                           show_default=True, help="CB-Agent's concept fitting data: the expert demonstrations, "
                           "or the won ICAL examples of the --demos memory (with their thoughts)."),
    "workers": shared("--workers", type=click.IntRange(min=1), default=1, show_default=True,
                      help="Episodes played at once, each worker with its own env and backbone, on a local "
                           "Ray cluster (needs the ray extra when > 1)."),
    "shared_lm": shared("--shared-lm", is_flag=True,
                        help="With --workers: one backbone per device behind a Ray actor that batches the "
                             "workers' scoring calls; workers never load the model."),
    "episode_timeout": shared("--episode-timeout", type=click.FloatRange(min=0, min_open=True),
                              default=EPISODE_TIMEOUT_S, show_default=True,
                              help="Wall-clock seconds one episode (all its trials) may take; past it the "
                                   "episode ends as a recorded failure (run: an error record; recover, "
                                   "calibrate label, ical: a skipped or failed item) and the command goes "
                                   "on with the next."),
    "concepts": shared("--concepts", type=click.Path(file_okay=False), default=None,
                       help="Act with the concepts of this folder (a round of `cb-agent improve`, e.g. "
                            "runs/improve/round-2/concepts, or `fit-concepts --out-dir`) instead of fitting "
                            "them on the expert demonstrations; checked against the run's settings."),
    "ray_address": shared("--ray-address", default=None,
                          help="Join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting a "
                               "local one."),
}


#: Every shared option by its ``config`` field (:data:`COMMON_OPTIONS` and :data:`RUN_OPTIONS`).
SHARED_OPTIONS: dict[str, SharedOption] = {**COMMON_OPTIONS, **RUN_OPTIONS}
#: The backbone's options: with any of them, :func:`config_from` resolves the device and dtype.
BACKBONE = frozenset({"model", "dtype", "device"})


def config_options(*names: str, check_model: bool = True,
                   **changes: Mapping[str, Any]) -> Callable[[Callable], Callable]:
    """Add the shared options ``names`` (keys of :data:`SHARED_OPTIONS`; ``changes``: name ->
    :meth:`SharedOption.but` arguments, e.g. a command's own help text) to a command, which
    receives them as one ``config:`` :class:`~agent_shell.run_config.ResolvedRun` (:func:`config_from`)."""

    def decorate(fn: Callable) -> Callable:
        command = config_from(*names, check_model=check_model)(fn)
        for name in reversed(names):
            command = shared_option(name, **changes.get(name, {}))(command)
        return command

    return decorate


def shared_option(name: str, **changes: Any) -> SharedOption:
    """The shared option of ``config`` field ``name`` (:data:`SHARED_OPTIONS`), with ``changes``
    (:meth:`SharedOption.but`) for one command."""
    return SHARED_OPTIONS[name].but(**changes) if changes else SHARED_OPTIONS[name]


def config_from(*names: str, check_model: bool = True) -> Callable[[Callable], Callable]:
    """Gather the values of the shared options ``names`` (declared on the command by
    :func:`config_options` or :func:`shared_option`) into one ``config:`` :class:`~agent_shell.run_config.ResolvedRun`,
    resolved here, once per command (:func:`agent_shell.configure.resolve`; the device and dtype when a backbone option
    is among ``names``, by the same rule everywhere); other fields keep their defaults.
    ``--all-games`` sets ``per_type`` and ``games`` to 0. An invalid value is a usage error naming
    the field; a ``--cache-dir`` or ``--out-dir`` folder that cannot be created (a regular file on the
    way) is a one-line error (:func:`cb_io.paths.writable_folder`; the results folder is not created
    yet); with ``model`` among ``names`` and ``check_model``, a model that cannot be found
    here, a CUDA device this machine lacks or a library outside its tested range
    (:func:`check_backbone`) is a one-line error before anything loads."""
    fields = set(RunConfig.field_names())

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def command(**kwargs: Any) -> object:
            values = {name: kwargs.pop(name) for name in names if name in fields}
            if kwargs.pop("all_games", False):
                values.update(per_type=0, games=0)
            try:
                config = resolve(RunConfig(**values), backbone=bool(BACKBONE & set(names)))
            except JaxPlatformError as err:  # the machine's setting, not an option
                raise click.ClickException(str(err)) from None
            except ValueError as err:
                raise click.UsageError(str(err)) from None
            if "cache_dir" in names:  # one line now, not a traceback from deep inside a later step
                try:
                    writable_folder(config.cache_dir if config.cache_dir is not None else cache_root())
                except ValueError as err:
                    raise click.ClickException(str(err)) from None
                if config.cache_dir is not None:  # the cache root of everything: games, compiled programs too
                    os.environ["CB_AGENT_CACHE"] = os.path.abspath(os.path.expanduser(config.cache_dir))
            if "out_dir" in names and config.out_dir:  # a regular file on the way: one line, not a traceback later
                try:
                    writable_folder(config.out_dir, "the results folder", "--out-dir", create=False)
                except ValueError as err:
                    raise click.ClickException(str(err)) from None
            if "model" in names and check_model:
                check_backbone(config.model, config.device)
            return fn(config=config, **kwargs)

        return command

    return decorate


def check_backbone(model: str | None, device: str | None) -> None:
    """One-line click errors, before anything loads, for a backbone that cannot load here: library
    versions outside their tested ranges (:mod:`agent_shell.lm.versions`), a model that cannot be
    found (:func:`agent_shell.lm.factory.check_model_source`) or a device this machine lacks."""
    from agent_shell.lm.factory import check_model_source, device_and_dtype
    from agent_shell.lm.versions import check_versions

    try:
        check_versions()
        check_model_source(model)
        device_and_dtype(model, device, "auto", check=True)  # the devices of the model's backend
    except (ValueError, FileNotFoundError, ModuleNotFoundError) as err:
        raise click.ClickException(str(err)) from None


def check_ray_start(config: RunConfig) -> None:
    """A one-line click error, before anything loads, when ``config`` plays on a local Ray cluster
    (``--workers`` > 1 or ``--shared-lm``) whose sockets would not fit their path limit
    (:func:`agent_shell.parallel.check_ray_tmpdir`)."""
    from agent_shell.parallel import check_ray_tmpdir, uses_ray

    if uses_ray(config) and not config.ray_address:
        try:
            check_ray_tmpdir()
        except ValueError as err:
            raise click.ClickException(str(err)) from None


def make_console():
    """A rich console; wide when output is not a terminal (logs, pipes), so tables never wrap."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


def task_error(env: Environment, split: str, err: ValueError) -> click.ClickException:
    """``err`` (a bad id or split) as a one-line click error ending in how to list the valid ids."""
    splits = getattr(env, "splits", ())
    listing = f"cb-agent tasks --env {env.name}" + (f" --split {split}" if split in splits else "")
    return click.ClickException(f"{err} (list the valid ids: {listing})")


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Run library calls (:mod:`agent_shell.pipeline`), turning the ValueError, FileNotFoundError,
    :class:`cb_io.storage.OutputError` or :class:`agent_shell.lm.protocol.BackboneFault` they raise
    into a one-line click error (the message's lines joined); an unknown split or task id
    (:class:`agent_shell.pipeline.UnknownTasks`) also says how to list the valid ids."""
    from agent_shell.pipeline import UnknownTasks

    try:
        yield
    except UnknownTasks as err:
        raise task_error(err.env, err.split, err) from None
    except (ValueError, FileNotFoundError, OutputError, BackboneFault) as err:
        raise click.ClickException(" ".join(str(err).split())) from None
