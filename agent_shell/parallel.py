"""The Ray executor of the episode scheduler (``cb-agent run --workers N`` / ``--ray-address``, and the
rounds of ``cb-agent improve --workers N``: :func:`play_on_ray`).

:class:`RayExecutor` plays the jobs of :func:`agent_shell.scheduler.play_episodes` (which decides
their order, retries, error records, partial states and progress output for every executor) on
Ray actors. Each actor (:class:`EpisodeWorker`) builds its own players once (environment instance,
backbone, agents: ``make_players()``) and then plays one episode at a time
(:func:`agent_shell.scheduler.play_job`); only the driver appends records. A worker holds one CPU
and no GPU: a backbone on a CUDA device is loaded once, by the LM server actor
(:mod:`agent_shell.lm.server`, placed by :func:`server_placement`), and the workers share it. When a worker dies
(killed, out of memory, a crashed engine taking the process down) its attempt is a failure
(reason ``worker died: ...``) and the worker is replaced by a fresh one; an episode that raises is
a failure too, and the scheduler plays it again.

Ray is imported only here and only when a Ray executor starts: ``--workers 1`` never needs it
(``pip install 'cb-agent[ray]'``). Must not be imported by the agents or the LM backends.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from agent_shell.lm.protocol import BackboneFault
from agent_shell.scheduler import Failure, Job, failure_of, play_job
from cb_io.storage import OutputError

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from rich.progress import Progress

    from agent_shell.agents import Reflexion
    from agent_shell.run_config import ResolvedRun
    from agent_shell.scheduler import RunSummary
    from envs.protocol import Environment

#: ``make_players() -> (env, {agent name: Reflexion})``: picklable; called once in each worker.
MakePlayers = Callable[[], tuple["Environment", Mapping[str, "Reflexion"]]]
INSTALL_HINT = "parallel episodes need Ray: pip install 'cb-agent[ray]' (or run with --workers 1)"


class EpisodeWorker:
    """What runs inside one Ray actor: its own players, one episode at a time."""

    def __init__(self, make_players: MakePlayers, max_steps: int, meta: dict[str, Any],
                 time_limit: float | None = None):
        self.env, self.agents = make_players()
        self.max_steps = max_steps
        self.meta = meta
        self.time_limit = time_limit

    def ready(self) -> int:
        """The worker's process id, once its players are built (raises what building raised)."""
        return os.getpid()

    def play(self, job: Job) -> dict[str, Any]:
        return play_job(self.env, self.agents, job, self.max_steps, self.meta, time_limit=self.time_limit)


def server_placement(device: str) -> dict[str, Any]:
    """``start_lm_server`` keywords that put the shared backbone on ``device`` (a
    :func:`agent_shell.lm.dtypes.device_name`): on CUDA the server actor asks Ray for one GPU and
    loads on ``"cuda"``, the one GPU Ray makes visible to it (Ray picks which: ``CUDA_VISIBLE_DEVICES``
    narrows the choice); on the CPU it asks for none."""
    if device.startswith("cuda"):
        return {"device": "cuda", "num_gpus": 1}
    return {"device": "cpu", "num_gpus": 0}


#: A Unix socket's path holds at most this many bytes (``sun_path`` less its final NUL, Linux).
SOCKET_PATH_MAX = 107
#: What a local Ray cluster adds to ``$RAY_TMPDIR`` for its longest socket path:
#: ``/ray/session_<date>_<time>_<microseconds>_<pid>/sockets/plasma_store`` (a 7-digit pid).
RAY_SOCKET_SUFFIX = len("/ray/session_2026-01-01_00-00-00_000000_1234567/sockets/plasma_store")


def check_ray_tmpdir() -> None:
    """Raise ValueError (one line) when ``$RAY_TMPDIR`` is too long for the sockets a local Ray
    cluster makes under it, before Ray starts (Ray itself fails deep inside with a traceback)."""
    folder = os.environ.get("RAY_TMPDIR")
    if not folder:
        return
    length = len(os.fsencode(os.path.abspath(folder)))
    if length + RAY_SOCKET_SUFFIX > SOCKET_PATH_MAX:
        raise ValueError(f"RAY_TMPDIR={folder} ({length} bytes) is too long for Ray's sockets: a Unix socket path "
                         f"holds at most {SOCKET_PATH_MAX} bytes and Ray adds {RAY_SOCKET_SUFFIX} to it; set "
                         f"RAY_TMPDIR to a folder of at most {SOCKET_PATH_MAX - RAY_SOCKET_SUFFIX} bytes "
                         "(e.g. /tmp/ray)")


def start_ray(workers: int, address: str | None = None) -> bool:
    """Connect to the cluster at ``address`` or start a local one with ``workers`` CPUs; False when
    this process was already connected (then the caller must not shut it down).

    Raises:
        ModuleNotFoundError: Ray is not installed (the message says how to install it).
        ValueError: a local cluster's ``$RAY_TMPDIR`` too long for its sockets (:func:`check_ray_tmpdir`).
    """
    if not address:
        check_ray_tmpdir()
    try:
        import ray
    except ImportError as err:
        raise ModuleNotFoundError(INSTALL_HINT) from err
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    return True


class RayExecutor:
    """Plays jobs on up to ``workers`` Ray actors (one CPU each), started as jobs come; joins the
    cluster at ``ray_address`` or uses (or starts) a local one. Its workers write partial states only
    on a local cluster (``local_files``).

    Raises:
        ValueError: ``workers`` below 1.
        ModuleNotFoundError: Ray is not installed (:meth:`start`).
        RuntimeError: a worker cannot build its players (:meth:`wait`: the error it raised, once).
    """

    def __init__(self, make_players: MakePlayers, workers: int, ray_address: str | None = None):
        if workers < 1:
            raise ValueError(f"workers={workers} must be >= 1")
        self.make_players, self.slots, self.ray_address = make_players, workers, ray_address
        self.local_files = ray_address is None
        self.started: list[ActorHandle] = []  # every actor, to kill at the end
        self.idle: list[ActorHandle] = []
        self.running: dict[ObjectRef, tuple[ActorHandle, Job]] = {}  # object ref -> (actor, job)
        self.building: list[tuple[ActorHandle, Job]] = []  # new workers and their first jobs
        self.owns_ray = False

    def start(self, max_steps: int, meta: dict[str, Any], on_step: Callable[[Job, list], None],
              time_limit: float | None = None) -> None:
        self.owns_ray = start_ray(self.slots, self.ray_address)
        import ray

        self.actor_class = ray.remote(num_cpus=1, max_restarts=0, max_concurrency=1)(EpisodeWorker)
        self.max_steps, self.meta, self.time_limit = max_steps, meta, time_limit

    def _play(self, actor: ActorHandle, job: Job) -> None:
        self.running[actor.play.remote(job)] = (actor, job)

    def _built(self) -> None:
        """Wait until the workers started since the last call have built their players (together,
        each on its own CPU), then hand them their first jobs.

        Raises:
            RuntimeError: a worker could not build its players (one line with the cause).
        """
        import ray
        from ray.exceptions import RayActorError

        building, self.building = self.building, []
        try:
            ray.get([actor.ready.remote() for actor, _ in building])
        except RayActorError as err:
            raise RuntimeError(f"a worker could not build its players: {failure_of(err).reason}") from None
        for actor, job in building:
            self._play(actor, job)

    def submit(self, job: Job) -> None:
        """Play ``job`` on an idle worker, or on a new one once it has built its players: new
        workers build theirs in the background, so the workers of a run start together."""
        if self.idle:
            self._play(self.idle.pop(), job)
            return
        actor = self.actor_class.remote(self.make_players, self.max_steps, self.meta, self.time_limit)
        self.started.append(actor)
        self.building.append((actor, job))

    def wait(self) -> tuple[Job, dict[str, Any] | Failure]:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        self._built()
        (ref,), _ = ray.wait(list(self.running), num_returns=1)
        actor, job = self.running.pop(ref)
        try:
            record = ray.get(ref)
        except RayActorError as err:  # the worker died: a fresh one takes its place at the next submit
            ray.kill(actor)
            return job, failure_of(err, "worker died: ")
        except RayTaskError as err:
            self.idle.append(actor)
            if isinstance(getattr(err, "cause", None), (OutputError, BackboneFault)):  # the run stops
                raise err.cause from None
            return job, failure_of(err)
        self.idle.append(actor)
        return job, record

    def close(self) -> None:
        import ray

        for actor in self.started:
            ray.kill(actor)
        self.started, self.idle, self.running, self.building = [], [], {}, []
        if self.owns_ray:
            ray.shutdown()


def uses_ray(config: ResolvedRun) -> bool:
    """Whether ``config``'s episodes are played on Ray workers (``--workers`` > 1, ``--ray-address``
    or ``--shared-lm``) rather than in this process."""
    return config.workers > 1 or bool(config.ray_address) or config.shared_lm


def play_on_ray(config: ResolvedRun, task_ids: Sequence[str], task_types: Sequence[str] | None, path: Path,
                meta: dict[str, Any], *, resume: bool, task_type_of: Callable[[str], str] | None = None,
                progress: Progress | None = None, echo: Callable[[str], None] = print) -> dict[str, RunSummary]:
    """``config.agents`` on ``task_ids`` on ``config.workers`` Ray workers (:class:`RayExecutor`),
    appended to ``path`` by :func:`agent_shell.scheduler.play_episodes` (its order, retries and
    resume rule); each worker builds its players as the driver did
    (:func:`agent_shell.pipeline.build_players`, from the caches the driver filled; the concepts of
    ``config.concepts`` when it names a folder). With ``--shared-lm`` (on by itself on CUDA) the
    workers share one backbone behind an ``LMServer`` actor on ``config.device``
    (:func:`server_placement`). Returns agent name -> :class:`agent_shell.scheduler.RunSummary`.

    Raises:
        ModuleNotFoundError: Ray is not installed; ValueError: ``$RAY_TMPDIR`` too long
            (:func:`start_ray`); what :func:`agent_shell.scheduler.play_episodes` raises.
    """
    from agent_shell import pipeline
    from agent_shell.scheduler import play_episodes

    owns_ray = start_ray(config.workers + int(config.shared_lm), config.ray_address)  # + the server's CPU
    try:
        server = None
        if config.shared_lm:
            from agent_shell.lm.server import start_lm_server

            server = start_lm_server(config.model, config.dtype, threads=1, **server_placement(config.device))
        types = None if task_types is None else list(task_types)
        players = functools.partial(pipeline.build_players, config, types, server)
        return play_episodes(RayExecutor(players, config.workers, config.ray_address), config.agents, list(task_ids),
                             Path(path), config.budget, resume=resume, meta=meta, task_type_of=task_type_of,
                             progress=progress, echo=echo, time_limit=config.episode_timeout,
                             keep_errors=config.keep_errors)
    finally:
        if owns_ray:
            import ray

            ray.shutdown()


__all__ = ["EpisodeWorker", "INSTALL_HINT", "MakePlayers", "RayExecutor", "play_on_ray", "server_placement",
           "start_ray", "uses_ray"]
