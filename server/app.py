"""Wiring: storage, runtime and the gRPC server, started and stopped together."""

from __future__ import annotations

import asyncio
import functools
import importlib
from typing import TYPE_CHECKING

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from leasehold._server import migrate
from leasehold._server.api.admin_servicer import ADMIN_SERVICE_NAME, AdminServiceServicer
from leasehold._server.api.call_gate import CallGate, OwnerCallLimit
from leasehold._server.api.page_token import PageTokenCodec
from leasehold._server.api.rpc_outcomes import unobserved
from leasehold._server.api.schedule_servicer import SCHEDULE_SERVICE_NAME, ScheduleServiceServicer
from leasehold._server.api.servicer import SERVICE_NAME, JobServiceServicer
from leasehold._server.api.stream_credentials import StreamCredentials
from leasehold._server.api.watch_streams import WatchStreams
from leasehold._server.api.worker_servicer import WORKER_SERVICE_NAME, WorkerServiceServicer
from leasehold._server.auth.authenticator import Authenticator
from leasehold._server.auth.identity import Role
from leasehold._server.clock import Clock, SystemClock
from leasehold._server.config import Settings, describe_duration
from leasehold._server.connections import Caps, descriptor_limit, grpc_options
from leasehold._server.dashboard.identity import owner_resolver
from leasehold._server.jobs.owner_limits import OwnerQuotas
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import ServedKinds
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.metrics.http import MetricsServer
from leasehold._server.metrics.instruments import Metrics
from leasehold._server.metrics.kind_labels import KindLabels
from leasehold._server.metrics.observed import ObservedRepository
from leasehold._server.metrics.queue import QueueCollector
from leasehold._server.remote.attempts import RemoteAttempts
from leasehold._server.remote.presence import WorkerPresence
from leasehold._server.remote.roster import WorkerRoster
from leasehold._server.runtime.claim_loop import Runtime
from leasehold._server.runtime.database_watch import DatabaseWatch
from leasehold._server.runtime.drain import let_attempts_finish, log_outcome
from leasehold._server.runtime.long_poll import LongPollClaimer
from leasehold._server.runtime.registry import HandlerRegistry
from leasehold._server.runtime.rescuer import Rescuer
from leasehold._server.runtime.retention import RetentionSweeper
from leasehold._server.runtime.schedule_timer import ScheduleTimer
from leasehold.v1 import admin_pb2, jobs_pb2, schedules_pb2, worker_pb2

if TYPE_CHECKING:
    from leasehold._server.dashboard.server import DashboardServer, PrivateListener

# Every service health answers for, the server as a whole ("") first.
HEALTH_SERVICES = ("", SERVICE_NAME, WORKER_SERVICE_NAME, SCHEDULE_SERVICE_NAME, ADMIN_SERVICE_NAME)

log = structlog.get_logger("leasehold.app")

# An 8 KB owner header must reach the resolver (and get a deterministic
# UNAUTHENTICATED) instead of grpc's probabilistic soft-limit rejection.
# Once the handlers are done (or handed back), calls still in flight get at most
# this long before they are cut: a drain ends within its grace plus this.
CALLS_GRACE_SECONDS = 0.5

GRPC_SERVER_OPTIONS = (
    ("grpc.max_metadata_size", 64 * 1024),
    ("grpc.absolute_max_metadata_size", 64 * 1024),
    # grpc core cancels calls at random once more than 1,000 have arrived that this
    # process has not yet picked up, which a burst of watchers resuming here from a
    # draining replica exceeds (bench group watch_streams opens 2,000 at once).
    # WatchEvents' own limits (--max-watch-streams) are what bound them.
    ("grpc.server.max_pending_requests", 10_000),
    ("grpc.server.max_pending_requests_hard_limit", 20_000),
)


def reuse_port(settings: Settings) -> tuple[tuple[str, int], ...]:
    """gRPC sets SO_REUSEPORT by default, so a second `serve` on a taken address
    would start silently and share the port: calls would alternate between two
    servers and two databases. Off, the second one fails to bind, loudly. Only
    the processes of one `serve --processes` share it, deliberately."""
    return (("grpc.so_reuseport", 1 if settings.siblings is not None else 0),)


def load_handlers(modules: tuple[str, ...]) -> HandlerRegistry:
    registry = HandlerRegistry()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ValueError(f"handlers: cannot import {name!r}: {exc}") from exc
        register = getattr(module, "register", None)
        if register is None:
            raise ValueError(f"handlers: module {name!r} has no register(registry) function")
        register(registry)
    return registry


class LeaseholdApp:
    """One service instance. `start()` serves until `stop()`."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock | None = None,
        registry: HandlerRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.registry = registry or load_handlers(settings.handler_modules)
        self.authenticator: Authenticator | None = None
        self.repository: SqlJobRepository | None = None
        self.runtime: Runtime | None = None
        self.rescuer: Rescuer | None = None
        self.schedule_timer: ScheduleTimer | None = None
        self.retention: RetentionSweeper | None = None
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self.database_watch: DatabaseWatch | None = None
        self.claimer: LongPollClaimer | None = None  # WorkerService's long polls
        # AdminService; its `stats` is the per-replica cached GetQueueStats read
        # (the dashboard reads the same cache).
        self.admin_servicer: AdminServiceServicer | None = None
        self.watch_streams = WatchStreams(settings.watch_limits)
        # Every open stream, so that it ends when its credential does.
        self.stream_credentials = StreamCredentials()
        self._stopped = False
        self._hurry = asyncio.Event()
        # Attempts remote workers hold through leases this replica handed out.
        self.remote_attempts = RemoteAttempts(self.clock)
        self.port: int | None = None
        # With --metrics-listen: the instruments, the repository that feeds
        # them (what the runtime and the servicers use) and /metrics.
        self.metrics: Metrics | None = None
        self.observed: ObservedRepository | None = None
        self.metrics_server: MetricsServer | None = None
        # With --dashboard-listen: the web UI, and the private listener it calls the API on.
        self.dashboard: DashboardServer | None = None
        self._dashboard_listener: PrivateListener | None = None
        # The connection caps, from the descriptor limit this process has at start.
        self.caps: Caps | None = None

    async def start(self, run_migrations: bool = True) -> int:
        """Migrate, open storage, start serving and working; returns the bound port."""
        # First: a bad token file, key file or certificate stops start-up before anything opens.
        self.authenticator = self.settings.auth.authenticator(self.settings.worker_token)
        tls = self.settings.auth.server_credentials()
        # Then the addresses: a taken one is one line at start, not a shared port.
        self.settings.ensure_listeners_free()
        if run_migrations:
            await asyncio.to_thread(migrate.upgrade, self.settings.database_url)
        limits = self.settings.connections
        caps = self.caps = limits.caps(descriptor_limit(), self.settings.database_pool_size)
        self.repository = SqlJobRepository(
            create_engines(self.settings.database_url, pool_size=self.settings.database_pool_size),
            self.clock,
            other_writers_poll_seconds=self.settings.runtime.poll_seconds,
            steering_rules=self.settings.steering,
            max_events_per_job=self.settings.max_events_per_job,
            siblings=self.settings.siblings,
        )
        self.database_watch = DatabaseWatch(
            self.repository.reachability, self.repository.ping, self._set_serving
        )
        jobs = self._start_metrics(self.repository)
        remote_kinds = self.settings.remote_kind_patterns
        runtime_settings = self.settings.runtime
        self.runtime = Runtime(jobs, self.registry, self.clock, runtime_settings, remote_kinds=remote_kinds)
        # On every replica: the repository recovers each expired lease once, however
        # many rescuers ask, and a saturated replica still gets its expired jobs back.
        self.rescuer = Rescuer(jobs, self.settings.runtime.rescue_interval)
        self.schedule_timer = ScheduleTimer(jobs, self.clock)
        # Always: with --retention 0 it keeps every job but still forgets old request ids.
        self.retention = RetentionSweeper(jobs, self.clock, self.settings.retention_seconds)
        registry = self.registry
        # A remote worker between two Claims is still there: one lease covers
        # the gap after any long poll.
        presence = WorkerPresence(self.clock, window_seconds=runtime_settings.lease_seconds)
        # The workers whose Claims this replica served (ListWorkers), likewise for one lease.
        roster = WorkerRoster(self.clock, runtime_settings.lease_seconds)

        serves = ServedKinds(registry, remote_kinds)
        page_tokens = PageTokenCodec(self.settings.page_token_key)
        quotas = OwnerQuotas(jobs, self.settings.owner_limits)
        servicer = JobServiceServicer(
            jobs,
            serves,
            page_tokens,
            cancel_grace_seconds=self.settings.cancel_grace,
            clock=self.clock,
            worked=lambda kind: (
                (kind in registry and not remote_kinds.matches(kind)) or presence.asked_for(kind)
            ),
            watch_streams=self.metrics.watch_streams.track_inprogress if self.metrics else None,
            watch_slots=self.watch_streams,
            quotas=quotas,
        )
        self.claimer = LongPollClaimer(
            jobs, self.clock, runtime_settings.lease_seconds, runtime_settings.poll_seconds
        )
        worker_servicer = WorkerServiceServicer(
            jobs,
            remote_kinds,
            self.claimer,
            runtime_settings.lease_seconds,
            presence,
            roster,
            self.remote_attempts,
        )
        schedule_servicer = ScheduleServiceServicer(
            jobs,
            servicer.owner_of,
            serves,
            page_tokens,
            self.clock,
            on_change=self.schedule_timer.wake,
            quotas=quotas,
        )
        admin_servicer = self.admin_servicer = AdminServiceServicer(
            jobs,
            page_tokens,
            self.clock,
            serves,
            cancel_grace_seconds=self.settings.cancel_grace,
            workers=functools.partial(roster.workers, jobs, remote_kinds),
        )
        rpc_finished = self.metrics.rpc_finished if self.metrics else unobserved
        server = grpc.aio.server(
            options=reuse_port(self.settings)
            + GRPC_SERVER_OPTIONS
            + grpc_options(self.settings.connections, caps.grpc)
        )
        calls = OwnerCallLimit(self.settings.max_calls_per_owner)
        streams = self.stream_credentials

        def gate(role: Role) -> CallGate:
            assert self.authenticator is not None
            return CallGate(self.authenticator, role, calls, streams)

        # Health and reflection are added apart from these: no credential in any mode.
        server.add_generic_rpc_handlers(
            (
                servicer.generic_handler(gate(Role.OWNER), rpc_finished),
                worker_servicer.generic_handler(gate(Role.WORKER), rpc_finished),
                schedule_servicer.generic_handler(gate(Role.OWNER), rpc_finished),
                admin_servicer.generic_handler(gate(Role.ADMIN), rpc_finished),
            )
        )
        health_servicer = self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (
                jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
                worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
                schedules_pb2.DESCRIPTOR.services_by_name["ScheduleService"].full_name,
                admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        try:
            self.port = (
                server.add_insecure_port(self.settings.listen)
                if tls is None
                else server.add_secure_port(self.settings.listen, tls)
            )
        except RuntimeError as exc:  # grpc reports a busy or bad address this way
            words = str(exc).split(";")[0]  # without grpc's hint about GRPC_VERBOSITY
            raise ValueError(f"listen: cannot bind {self.settings.listen}: {words}") from None
        self._add_dashboard_listener(server)
        await server.start()
        self._server = server
        await self._start_dashboard()
        await self._set_serving(True)
        await self.runtime.start()
        await self.rescuer.start()
        await self.schedule_timer.start()
        if self.retention is not None:
            await self.retention.start()
        log.info(
            "server.started",
            listen=self.settings.listen,
            port=self.port,
            worker_id=self.runtime.worker_id,
            kinds=sorted(self.registry.kinds()),
            remote_kinds=remote_kinds.describe(),
            steering=self.settings.steering.describe(),
            retention=describe_duration(self.settings.retention_seconds),
            metrics=self.metrics_server.url if self.metrics_server else "off",
            dashboard=self.dashboard.url if self.dashboard else "off",
            auth=self.settings.auth.mode,
            tls=self.settings.auth.tls,
            worker_service="enabled"
            if self.settings.worker_token or self.settings.auth.mode != "header"
            else "disabled (no LEASEHOLD_WORKER_TOKEN)",
            event_loop=type(asyncio.get_running_loop()).__module__.partition(".")[0],
        )
        if self.settings.auth.exposes_credentials(self.settings.listen):
            log.warning(
                "server.plaintext_credentials",
                reason=f"--auth {self.settings.auth.mode} without --tls-cert beyond loopback: "
                "bearer credentials cross the network in the clear",
            )
        return self.port

    def _start_metrics(self, repository: JobRepository) -> JobRepository:
        """With --metrics-listen, serve /metrics and return the repository that
        counts for it; without, the repository itself (nothing counted)."""
        if self.settings.metrics_listen is None:
            return repository
        kind_label = KindLabels.of(
            self.registry, self.settings.remote_kind_patterns, self.settings.metrics_kind_patterns
        )
        self.metrics = Metrics(kind_label)
        self.observed = ObservedRepository(repository, self.metrics, self.clock)
        self.metrics.registry.register(
            QueueCollector(
                self.observed.queued_by_kind, asyncio.get_running_loop(), self.clock, kind_label=kind_label
            )
        )
        self.metrics_server = MetricsServer(
            self.settings.metrics_listen,
            self.metrics.registry,
            timeout_seconds=self.settings.connections.handshake_timeout_seconds,
        )
        self.metrics_server.start()
        return self.observed

    def _add_dashboard_listener(self, server: grpc.aio.Server) -> None:
        if self.settings.dashboard_listen is not None:
            # The web stack (uvicorn, Starlette, Jinja) is imported only by a server
            # that serves the dashboard: every other one starts that much sooner.
            from leasehold._server.dashboard.server import PrivateListener

            self._dashboard_listener = PrivateListener()
            server.add_insecure_port(self._dashboard_listener.target)

    async def _start_dashboard(self) -> None:
        """After the gRPC server: the dashboard's pages call it."""
        if self._dashboard_listener is None or self.settings.dashboard_listen is None:
            return
        from leasehold._server.dashboard.server import DashboardServer

        auth = self.settings.auth
        self.dashboard = DashboardServer(
            self.settings.dashboard_listen,
            self._dashboard_listener.target,
            auth.mode,
            self.clock,
            tls_cert=auth.tls_cert,
            tls_key=auth.tls_key,
            owner_of=owner_resolver(self.authenticator) if self.authenticator is not None else None,
            allowed_hosts=self.settings.dashboard_allowed_hosts,
            forwarded_allow_ips=self.settings.forwarded_allow_ips,
            limits=self.settings.connections,
            max_connections=self.caps.dashboard if self.caps is not None else 1_000,
        )
        await self.dashboard.start()

    def reload_credentials(self) -> None:
        """SIGHUP: re-read the token file or JWT keys; bad new ones keep the old."""
        if self.authenticator is not None:
            self.authenticator.reload()
            # A token taken out of the file ends the streams it opened, too.
            self.stream_credentials.recheck_all()

    def hurry(self) -> None:
        """A second SIGINT/SIGTERM: stop waiting for running attempts now (local
        ones are handed back to the queue)."""
        if self._stopped and not self._hurry.is_set():
            log.info("server.hurrying", message="handing the running attempts back now")
        self._hurry.set()

    async def stop(self, grace_seconds: float = 1.0) -> None:
        """Drain (DESIGN §13, docs/operations.md), then stop: health says
        NOT_SERVING first, claiming stops, waiting Claims return empty, watch
        streams end UNAVAILABLE; running attempts, local and remote, get
        `grace_seconds` to finish (or until `hurry()`), and the local ones left
        are handed back to the queue; only then does the listener close, so
        unary calls (a remote worker's Complete among them) are served until
        the end. Stopping again does nothing."""
        if self._stopped:
            return
        self._stopped = True
        if self._server is None:  # start() failed before serving: nothing to drain
            await self._close()
            return
        await self._begin_drain()
        tasks = [asyncio.ensure_future(self.dashboard.stop())] if self.dashboard is not None else []
        for timer in (self.rescuer, self.schedule_timer, self.retention):
            if timer is not None:
                tasks.append(asyncio.ensure_future(timer.stop()))
        try:
            if self.runtime is not None:
                await self.runtime.stop_claiming()
            outcome = await let_attempts_finish(
                self.runtime, self.remote_attempts, grace_seconds, self._hurry, self.watch_streams.open
            )
            if self.runtime is not None:
                await self.runtime.stop(0)  # hands back what is left
            log_outcome(outcome, grace_seconds)
            await asyncio.gather(*tasks)
            closing = [self._server.stop(CALLS_GRACE_SECONDS)]
            if self.metrics_server is not None:  # scraped until the end of the drain
                closing.append(self.metrics_server.stop())
            await asyncio.gather(*closing)
        finally:
            await self._close()
        log.info("server.stopped")

    async def _close(self) -> None:
        if self.metrics_server is not None and self._server is None:
            await self.metrics_server.stop()
        if self.database_watch is not None:
            await self.database_watch.stop()
        if self.repository is not None:
            await self.repository.close()
        if self._dashboard_listener is not None:
            self._dashboard_listener.remove()

    async def _set_serving(self, serving: bool) -> None:
        """Health for every service: SERVING, or NOT_SERVING while no writable
        database answers (`DatabaseWatch`). A drain's NOT_SERVING outlasts
        either: the servicer ignores settings after it."""
        if self._health is None:
            return
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in HEALTH_SERVICES:
            await self._health.set(service, status)

    async def _begin_drain(self) -> None:
        """What must happen at once, before anything waits: a load balancer
        watching health stops sending traffic, and whoever waits on this server
        is told to come back (here once it restarts, or to any replica)."""
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        self.watch_streams.drain()
        if self.claimer is not None:
            self.claimer.drain()
        if self.repository is not None:
            self.repository.changes.interrupt_watchers()
