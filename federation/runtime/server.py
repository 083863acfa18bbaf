"""One gpufed server: the gRPC API for everyone, the scheduling loop when it is the leader.

Any number of servers may share one etcd. All serve reads and submissions; the one holding the
leader lease also runs the scheduling cycle and the reconcilers, and fences each of its commits
with the lease, so a server that lost leadership cannot commit a stale decision. A server of role
`api` (federation.runtime.role) never stands for leader. Its HTTP port
serves the web console (`federation.console`) and `/metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import structlog
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from federation.api.admin import AdminService
from federation.api.datasets import DatasetService
from federation.api.logs import LogsService
from federation.api.reports import ReportService
from federation.api.secrets import SecretService
from federation.api.service import FederationService, JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.capacity.store import CapacityStore
from federation.console.app import build_app
from federation.console.calls import ConsoleCalls
from federation.console.session import SessionStore
from federation.datasets.check import DatasetCheck
from federation.datasets.executor import Executors, get_settings
from federation.datasets.registry import DatasetRegistry, locations_reader
from federation.datasets.staging import Stager
from federation.datasets.staging_run import SyncRunner
from federation.datasets.stores import StoreDirectory
from federation.datasets.syncs import SyncRecords
from federation.errors import GpufedError
from federation.history.config import HistorySettings
from federation.history.sql_store import SqlHistoryStore
from federation.joblogs.archive import LogArchive, LogsSettings, get_logs_settings
from federation.ledger.cache import LedgerCache
from federation.metrics import Metrics
from federation.runtime.capacity_wiring import CapacityWiring
from federation.runtime.heap import HeapFreezer, tune_collector
from federation.runtime.history_wiring import history_shown, open_history
from federation.runtime.members_service import MembersService
from federation.runtime.readiness import ReadinessInputs, readyz_handler
from federation.runtime.role import ServerRole
from federation.scheduling.archived_usage import ArchivedUsage
from federation.scheduling.archiver import Archiver
from federation.scheduling.collector import finished_gang_retention_s
from federation.scheduling.compactor import DEFAULT_RETENTION_S as COMPACTION_RETENTION_S
from federation.scheduling.compactor import Compactor
from federation.scheduling.dispatch_backoff import ClusterRefusing, refusing_clusters
from federation.scheduling.leader import DEFAULT_LEASE_TTL_S, LeaderElection
from federation.scheduling.lease_keeper import keeper_timeout_s
from federation.scheduling.logs_keep import AttemptKeeper
from federation.scheduling.members import MemberClusters
from federation.scheduling.reconciler import Reconciler
from federation.scheduling.scheduler import Scheduler
from federation.secrets.crypto import Keyring
from federation.secrets.jobs import GangSecrets, JobSecretMasks, SecretCheck
from federation.secrets.keyfile import ENV_VAR as SECRETS_KEY_ENV
from federation.secrets.keyfile import FILE_NAME as SECRETS_KEY_FILE
from federation.secrets.keyfile import load_key_file
from federation.secrets.masking import SecretMask
from federation.secrets.store import SecretStore
from federation.security.auth import Authenticator
from federation.security.ratelimit import READ_RATE_PER_S, ReadRateLimiter
from federation.security.tokens import SecurityStore
from federation.store.job_cache import JobCache
from federation.store.job_store import LEADER_KEY, Fence, KvStore
from federation.store.kv_etcd import EtcdKv
from federation.store.kv_etcd_lease import BlockingLeaseClient
from federation.store.records import SchedulingSettings, TenantRecord
from placement.model import ClusterName, ClusterState, JobId, TenantId

log = structlog.get_logger("gpufed.server")

# Tenants change rarely; re-read them at most this often rather than on every submission.
TENANT_REFRESH_S = 2.0
# How long a thread holds the GIL while another waits for it (CPython's default: 5 ms). The placer
# plans on a worker thread; with a deep queue it computes for hundreds of milliseconds, and every
# step of every API call on the event loop waited up to a whole interval for the GIL, several times
# per call (issue 30, item 15: another tenant's ListJobs p99 rose 2 to 4 times). At 0.5 ms the loop
# gets it back ten times sooner; the plan's switches cost it little (bench/listjobs_queue.py).
SWITCH_INTERVAL_S = 0.0005
# How often the server looks whether its heap should be frozen again (`federation.runtime.heap`).
HEAP_CHECK_S = 5.0
LEADER_STOP_TIMEOUT_S = 10.0
# After a term that a bug ended: the wait before standing again, doubled for each such term in a row.
LEADER_CRASH_WAIT_S = 1.0
LEADER_CRASH_WAIT_MAX_S = 60.0
# How often a standby builds the queued jobs' requests for the cycle it may have to run
# (`FederationServer._stand_by`).
STANDBY_WARM_S = 2.0
# How long a new leader's archiver waits for the first pass before it starts regardless.
ARCHIVE_WAITS_FOR_FIRST_PASS_S = 30.0


# The server's per-member etcd deadline unless `gpufed serve --etcd-timeout-s` says otherwise.
DEFAULT_ETCD_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class ServerConfig:
    etcd_endpoint: str
    state_dir: Path
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 0
    metrics_port: int | None = None
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    cycle_interval_s: float = 0.5
    # Cycles never run closer together than this, however often jobs change.
    min_cycle_gap_s: float = 0.05
    lease_ttl_s: int = DEFAULT_LEASE_TTL_S
    # How long the event loop may stall while the lease keeper's thread still refreshes the lease
    # (`federation.scheduling.lease_keeper`); None: 10 s, or the TTL if longer.
    lease_stall_limit_s: float | None = None
    # What each etcd member has to answer a call before the client tries the next (`EtcdKv`).
    etcd_timeout_s: float = DEFAULT_ETCD_TIMEOUT_S
    # TLS on the gRPC port: certificate chain and key (PEM); with a client CA, clients must present
    # a certificate it signed (mutual TLS) as well as their bearer token.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # Lists, watches and job lookups that reach etcd, per caller per second on this server (0: no limit).
    read_rate_per_s: float = READ_RATE_PER_S
    # Kept logs and the limits of `gpufed logs` (federation.joblogs.archive).
    logs: LogsSettings = field(default_factory=LogsSettings)
    # The history store (SQLite under the state dir unless a DSN is given) and the archiver's knobs.
    history: HistorySettings = field(default_factory=HistorySettings)
    # Seconds the archiver waits between passes once it has caught up (None: its own rule, at most
    # 30 s and a quarter of `history.retainInEtcd`; tests shorten it).
    archive_idle_s: float | None = None
    # The leader compacts etcd's history older than this (federation.scheduling.compactor), for an
    # external etcd run without `--auto-compaction-*`; None: leave compaction to etcd's operator.
    etcd_compaction_retention_s: float | None = COMPACTION_RETENTION_S
    # The key that seals tenants' secrets (federation.secrets.keyfile). None: GPUFED_SECRETS_KEY_FILE,
    # else `secrets.key` in the state dir if there is one (`gpufed up` makes it), else no secrets.
    secrets_key_file: Path | None = None
    # `gpufed serve --role` (federation.runtime.role): an `api` server never stands for leader.
    role: ServerRole = ServerRole.ALL
    # `gpufed serve --compress-wait-reasons` (`federation.store.job_store.encode_wait_reasons`): on
    # only once no server of the release before this one is left.
    compress_wait_reasons: bool = False
    # SO_REUSEPORT on the gRPC port: only for a server and its API workers (`gpufed serve
    # --api-workers`, federation.runtime.api_workers), which share the port on purpose. Otherwise off,
    # so that a second server started on a port already served fails to bind instead of silently
    # taking half of its connections (gRPC's own default is on).
    grpc_reuse_port: bool = False


def _secrets_keyring(cfg: ServerConfig) -> Keyring | None:
    """The keys that seal tenants' secrets: a bad key file stops the server (its error names the
    file), a missing one leaves secrets off, which the Secrets calls then say."""
    path = cfg.secrets_key_file
    if path is None and os.environ.get(SECRETS_KEY_ENV):
        path = Path(os.environ[SECRETS_KEY_ENV])
    if path is None and (cfg.state_dir / SECRETS_KEY_FILE).exists():
        path = cfg.state_dir / SECRETS_KEY_FILE
    if path is None:
        log.info("secrets_disabled", why=f"no {SECRETS_KEY_ENV} and no {SECRETS_KEY_FILE} in the state dir")
        return None
    ring = load_key_file(path)
    log.info("secrets_key_loaded", path=str(path), key_ids=list(ring.key_ids))
    return ring


class TenantDirectory:
    """Tenants and scheduling settings for the submission path, re-read at most every few seconds."""

    def __init__(self, store: KvStore, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._clock = clock
        self._tenants: dict[TenantId, TenantRecord] = {}
        self._settings = SchedulingSettings()
        self._read_at = float("-inf")
        # Counts `forget` calls: a read begun before one may hold what the write replaced. `_held_from`
        # is the count when the read held now began.
        self._forgotten = 0
        self._held_from = 0

    async def _refresh(self) -> None:
        if self._clock() - self._read_at > TENANT_REFRESH_S:
            forgotten = self._forgotten
            tenants = {t.name: t for t in await self._store.list_tenants()}
            settings = await self._store.get_settings()
            # Reads overlap (submissions, the set controller's room) and may end in any order: one
            # begun before a write never replaces one begun after it, and one a write overtook is not
            # kept as fresh, which hid the write for TENANT_REFRESH_S; the next call reads again.
            if forgotten >= self._held_from:
                self._tenants, self._settings, self._held_from = tenants, settings, forgotten
            self._read_at = self._clock() if self._held_from == self._forgotten else float("-inf")

    async def get(self, name: TenantId) -> TenantRecord | None:
        await self._refresh()
        return self._tenants.get(name)

    async def settings(self) -> SchedulingSettings:
        await self._refresh()
        return self._settings

    def forget(self) -> None:
        """Read again at the next call: this server just wrote a tenant, so its own submissions see
        the change at once (an admin who deletes a tenant, or lowers its limits, is not followed by
        2 s of submissions on the old record). Other servers, and other API processes, keep the
        TENANT_REFRESH_S bound."""
        self._read_at = float("-inf")
        self._forgotten += 1


class FederationServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self._kv: EtcdKv | None = None
        self._grpc: grpc.aio.Server | None = None
        self._cache: JobCache | None = None
        self._ledger: LedgerCache | None = None
        self._election: LeaderElection | None = None
        self._leader_task: asyncio.Task[None] | None = None
        self._heap_task: asyncio.Task[None] | None = None
        self._http: web.AppRunner | None = None
        self.members: MemberClusters | None = None
        self._stores: StoreDirectory | None = None
        self._stager: Stager | None = None
        self._executors: Executors | None = None
        self._capacity: CapacityWiring | None = None
        self._archiver: Archiver | None = None
        self._compactor: Compactor | None = None
        self._archived_usage: ArchivedUsage | None = None
        # One history store per server: the archiver writes it, the read paths read it.
        self.history: SqlHistoryStore | None = None
        self.port = 0
        self.metrics_port: int | None = None
        # Set once this leadership term's first reconciler tick and scheduling cycle completed
        # (`/readyz`, federation.runtime.readiness); cleared when leadership is lost.
        self.first_pass_done = False
        # The servicers, also called in process by the web console.
        self.servicers: list[object] = []

    async def start(self) -> None:
        cfg = self.config
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        tune_collector()
        self._kv = await EtcdKv.connect(cfg.etcd_endpoint, timeout_s=cfg.etcd_timeout_s)
        store = KvStore(self._kv, compress_wait_reasons=cfg.compress_wait_reasons)
        self._cache = JobCache(store)
        self._ledger = LedgerCache(store)
        # A restart's longest wait: every job and interval in etcd listed, and the history store
        # opened (blocking, it may migrate the schema: on a worker thread). Side by side, so that one
        # list's decoding overlaps the other's requests and the database's open.
        listing_began, listing_cpu_began = time.monotonic(), time.process_time()
        opening = asyncio.ensure_future(asyncio.to_thread(open_history, cfg.history, cfg.state_dir))
        usage_read = asyncio.ensure_future(self._read_archived_usage(store, opening))
        try:
            await asyncio.gather(self._cache.start(), self._ledger.start())
        finally:
            # Kept even when a list failed, so that stop() closes it.
            self.history = history = await opening
            self._archived_usage = await usage_read
        listed_s = time.monotonic() - listing_began
        listed_cpu_s = time.process_time() - listing_cpu_began
        tenants = TenantDirectory(store)
        cluster_records = await store.list_clusters()
        self.members = MemberClusters.build(cluster_records, state_dir=cfg.state_dir)
        members = self.members
        await members.start()
        auth = Authenticator(store)
        registry = DatasetRegistry(self._kv)

        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 4 * 1024 * 1024),
                ("grpc.so_reuseport", 1 if cfg.grpc_reuse_port else 0),
            ]
        )
        security = SecurityStore(self._kv)
        secrets = SecretStore(self._kv, _secrets_keyring(cfg))
        jobs = JobService(
            history=history,
            store=store,
            cache=self._cache,
            auth=auth,
            metrics=self.metrics,
            tenants=tenants,
            datasets=(dataset_check := DatasetCheck(registry)),
            read_limiter=ReadRateLimiter(self.config.read_rate_per_s),
            security=security,
            ledger=self._ledger,
            secrets=SecretCheck(secrets),
        )
        pb_grpc.add_JobServiceServicer_to_server(jobs, server)
        admin = AdminService(
            history=history,
            store=store,
            security=security,
            cache=self._cache,
            auth=auth,
            metrics=self.metrics,
            tenants_changed=tenants.forget,
        )
        pb_grpc.add_AdminServiceServicer_to_server(admin, server)
        reports = ReportService(
            history=history,
            ledger=self._ledger,
            store=store,
            auth=auth,
            metrics=self.metrics,
            provisioned=CapacityStore(self._kv).list_intervals,
        )
        pb_grpc.add_ReportServiceServicer_to_server(reports, server)

        async def clusters() -> list[ClusterState]:
            return await members.inventories()

        job_cache = self._cache

        def refusing() -> dict[ClusterName, ClusterRefusing]:
            # The acting jobs hold every live job with a refusal or a placement (what the verdict
            # reads): walking every live job was a walk of the whole queue on the event loop for each
            # `gpufed clusters`, 0.1 s at a million queued.
            return refusing_clusters((s.value for s in job_cache.acting_jobs()), time.time())

        federation = FederationService(auth=auth, metrics=self.metrics, clusters=clusters, refusing=refusing)
        pb_grpc.add_FederationServiceServicer_to_server(federation, server)
        self._capacity = capacity = await CapacityWiring.build(
            kv=self._kv,
            store=store,
            cache=self._cache,
            members=members,
            auth=auth,
            metrics=self.metrics,
            state_dir=cfg.state_dir,
        )
        capacity.register(server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        syncs = SyncRecords(self._kv)
        self._stores = stores = StoreDirectory(self._kv)
        datasets = DatasetService(
            store=store,
            registry=registry,
            stores=stores,
            syncs=syncs,
            auth=auth,
            metrics=self.metrics,
            cache=self._cache,
        )
        # A version a live job will make may be named as input: accepted, then waited for (issue 34).
        dataset_check.declared = datasets.outputs.declared
        pb_grpc.add_DatasetsServicer_to_server(datasets, server)
        # `gpufed cluster join`: clusters registered at run time, driven by this server at once.
        joins = MembersService(
            store=store,
            security=security,
            auth=auth,
            metrics=self.metrics,
            drive=lambda record: members.add(record, cfg.state_dir),
        )
        pb_grpc.add_MembersServicer_to_server(joins, server)
        # As bootstrap wrote them from the config's `logs:`, the same on every server; else ours.
        masks = JobSecretMasks(secrets)

        async def mask_for(job_id: str) -> SecretMask:
            # The job of an attempt being kept is live, so in the cache; etcd if a watch lags.
            found = job_cache.get(JobId(job_id)) or await store.get_job(JobId(job_id))
            return (
                SecretMask(()) if found is None else await masks.for_job(found.value.tenant, found.value.spec)
            )

        archive = LogArchive(self._kv, await get_logs_settings(self._kv) or cfg.logs, mask_for)
        logs = LogsService(
            history=history,
            store=store,
            cache=self._cache,
            auth=auth,
            metrics=self.metrics,
            members=members,
            archive=archive,
            read_limiter=ReadRateLimiter(self.config.read_rate_per_s),
            ledger=self._ledger,
            masks=masks,
        )
        pb_grpc.add_LogsServicer_to_server(logs, server)

        async def tenant_exists(name: str) -> bool:
            return await store.get_tenant(TenantId(name)) is not None

        secret_service = SecretService(
            secrets=secrets, auth=auth, metrics=self.metrics, tenant_exists=tenant_exists, security=security
        )
        pb_grpc.add_SecretsServicer_to_server(secret_service, server)
        self.servicers = [jobs, admin, reports, federation, capacity.service, datasets, logs, secret_service]
        services = [
            pb.DESCRIPTOR.services_by_name["Logs"].full_name,
            pb.DESCRIPTOR.services_by_name["Datasets"].full_name,
            pb.DESCRIPTOR.services_by_name["JobService"].full_name,
            pb.DESCRIPTOR.services_by_name["FederationService"].full_name,
            pb.DESCRIPTOR.services_by_name["AdminService"].full_name,
            pb.DESCRIPTOR.services_by_name["ReportService"].full_name,
            pb.DESCRIPTOR.services_by_name["Capacity"].full_name,
            pb.DESCRIPTOR.services_by_name["Members"].full_name,
            pb.DESCRIPTOR.services_by_name["Secrets"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ]
        reflection.enable_server_reflection(services, server)
        address = f"{cfg.grpc_host}:{cfg.grpc_port}"
        if cfg.tls_cert is not None and cfg.tls_key is not None:
            credentials = grpc.ssl_server_credentials(
                [(cfg.tls_key.read_bytes(), cfg.tls_cert.read_bytes())],
                root_certificates=None if cfg.tls_client_ca is None else cfg.tls_client_ca.read_bytes(),
                require_client_auth=cfg.tls_client_ca is not None,
            )
            self.port = server.add_secure_port(address, credentials)
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        self._grpc = server

        if cfg.metrics_port is not None:
            await self._serve_http(cfg.metrics_port)

        scheduler = Scheduler(
            archived_usage=self._archived_usage,
            store=store,
            cache=self._cache,
            ledger=self._ledger,
            members=members,
            metrics=self.metrics,
            dataset_locations=locations_reader(registry),
            capacity=capacity.reconciler,
        )
        cluster_stores = {r.name: r.object_store for r in cluster_records}
        self._executors = Executors(await get_settings(self._kv), journal_dir=cfg.state_dir / "datasync")
        self._stager = Stager(
            registry=registry,
            syncs=syncs,
            runner=SyncRunner(
                registry=registry,
                syncs=syncs,
                stores=stores,
                settings=tenants.settings,
                journal_dir=cfg.state_dir / "datasync",
                options=self._executors.settings.sync_options(),
                executors=self._executors,
            ),
            cluster_store=cluster_stores.get,
        )
        self._stager.declared = datasets.outputs.declared
        reconciler = Reconciler(
            store=store,
            cache=self._cache,
            members=members,
            metrics=self.metrics,
            staging=self._stager,
            keeper=AttemptKeeper(archive, members),
            finished_gang_retention_s=finished_gang_retention_s(
                cfg.history.retain_in_etcd_s if cfg.history.archive else None
            ),
            archived_ids=history.archived_ids if cfg.history.archive else None,
            secrets=GangSecrets(secrets),
        )
        if cfg.history.archive:
            self._archiver = Archiver(
                kv=self._kv,
                cache=self._cache,
                history=history,
                settings=cfg.history,
                metrics=self.metrics,
                idle_s=cfg.archive_idle_s,
                logs_retain_s=archive.settings.retain_hours * 3600.0,
            )
        if cfg.etcd_compaction_retention_s is not None:
            self._compactor = Compactor(self._kv, retention_s=cfg.etcd_compaction_retention_s)
        if cfg.role.stands_for_leader:
            self._election = LeaderElection(
                self._kv,
                cfg.identity,
                ttl_s=cfg.lease_ttl_s,
                # Refreshed from a thread with its own client, so that a stalled loop keeps the lease;
                # with several etcd members, one that hangs costs a refresh a third of the TTL at most.
                # Blocking gRPC: an asyncio client in the thread was woken for every gRPC call of
                # the server (kv_etcd_lease says why).
                refresh_kv=functools.partial(
                    BlockingLeaseClient.twin_of,
                    self._kv,
                    timeout_s=keeper_timeout_s(cfg.lease_ttl_s, self._kv.timeout_s, members=self._kv.members),
                ),
                stall_limit_s=cfg.lease_stall_limit_s,
            )
            self._leader_task = asyncio.create_task(self._lead(scheduler, reconciler), name="gpufed-leader")
        self._heap_task = asyncio.create_task(self._keep_heap(), name="gpufed-heap")
        log.info(
            "server_started",
            # What a restart spends before it serves (issue 19): listing etcd's jobs and intervals.
            listed_s=round(listed_s, 3),
            # The process's CPU seconds, in the listing and since it began (the interpreter and
            # the imports included): a shared machine's load swings the wall time, not these.
            listed_cpu_s=round(listed_cpu_s, 3),
            cpu_s=round(time.process_time(), 3),
            jobs=self._cache.count(),
            port=self.port,
            metrics_port=self.metrics_port,
            console_url=self.console_url,
            identity=cfg.identity,
            role=cfg.role.value,
            # Which database the history goes to, without its password (issue 30, item 10).
            history=history_shown(cfg.history, cfg.state_dir),
        )

    @property
    def tls(self) -> bool:
        return self.config.tls_cert is not None and self.config.tls_key is not None

    @property
    def console_url(self) -> str | None:
        """The web console's address (`/metrics` is beside it), once the HTTP port is served."""
        if self.metrics_port is None:
            return None
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.config.grpc_host}:{self.metrics_port}/"

    async def _serve_http(self, port: int) -> None:
        """The HTTP port: the web console and `/metrics`, over TLS with the gRPC port's certificate."""
        cfg = self.config
        ssl_context: ssl.SSLContext | None = None
        if cfg.tls_cert is not None and cfg.tls_key is not None:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.minimum_version = ssl.TLSVersion.TLSv1_2
            ssl_context.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        app = build_app(
            ConsoleCalls(self.servicers),
            registry=self.metrics.registry,
            secure=self.tls,
            # In etcd: every server sharing it knows a session, and a restart keeps it (issue 30).
            sessions=SessionStore(self._kv),
            readyz=readyz_handler(self.readiness_inputs),
        )
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, cfg.grpc_host, port, ssl_context=ssl_context)
        await site.start()
        self._http = runner
        self.metrics_port = int(runner.addresses[0][1])

    async def readiness_inputs(self) -> ReadinessInputs:
        """What `/readyz` judges by; reads the leader key from etcd only when this server does not lead."""
        leading = self._election is not None and self._election.is_leader
        leader_elsewhere: str | None = None
        if not leading and self._kv is not None:
            held = await self._kv.get(LEADER_KEY)
            holder = None if held is None else held.value.decode(errors="replace")
            # Our own identity: the key is written but the election has not returned yet; leading,
            # with the first pass still to run.
            leading = holder == self.config.identity
            leader_elsewhere = None if leading else holder
        return ReadinessInputs(
            grpc_serving=self._grpc is not None,
            jobs_listed=self._cache is not None and self._cache.synced,
            ledger_listed=self._ledger is not None and self._ledger.synced,
            leading=leading,
            first_pass_done=leading and self.first_pass_done,
            leader_elsewhere=leader_elsewhere,
            api_only=not self.config.role.stands_for_leader,
        )

    async def _read_archived_usage(
        self, store: KvStore, opening: asyncio.Future[SqlHistoryStore]
    ) -> ArchivedUsage:
        """The archived usage, its first read started as soon as the history store is open: it runs
        on a worker thread (SQL) while the caches list etcd, so the leader's first cycle, which
        needs it, does not wait for the query after the listing. Never fails: without the settings
        the first cycle reads it itself."""
        history = await opening
        usage = ArchivedUsage(history)
        try:
            settings = await store.get_settings()
        except Exception:
            log.warning("archived_usage_not_prefetched", exc_info=True)
            return usage
        # Never read yet, so this starts the first read now, in the background.
        usage.refresh_if_due(time.time(), settings.usage_half_life_h)
        return usage

    async def _lead(self, scheduler: Scheduler, reconciler: Reconciler) -> None:
        assert self._election is not None
        assert self._cache is not None
        election = self._election
        crashes = 0
        while True:
            try:
                await self._lead_term(scheduler, reconciler)
                crashes = 0
            except Exception:
                # A bug (not an etcd or cluster hiccup: `_loop` retries those) ended this term. Dying
                # quietly would leave the keepalive task refreshing the lease of a leader that no
                # longer schedules, and no standby could ever take over. Give the key back instead,
                # so a standby leads, and wait before standing again (longer each time in a row).
                crashes += 1
                wait_s = min(LEADER_CRASH_WAIT_S * 2 ** (crashes - 1), LEADER_CRASH_WAIT_MAX_S)
                log.exception("leader_term_crashed", identity=self.config.identity, wait_s=wait_s)
                self.metrics.leader_crashes.inc()
                with contextlib.suppress(GpufedError):
                    await election.resign()
                await asyncio.sleep(wait_s)

    async def _lead_term(self, scheduler: Scheduler, reconciler: Reconciler) -> None:
        """One term: wait to lead, then schedule until leadership is lost."""
        assert self._election is not None
        election = self._election
        fence = await self._stand_by(scheduler, election)
        self.first_pass_done = False
        self.metrics.is_leader.set(1)
        log.info("leader_elected", identity=self.config.identity)
        # Beside the loop, never in it: a backlog must not delay a scheduling cycle. Nor the first
        # pass: its first scan reads every ended job's record, which a restart leaves undecoded
        # until read (`Stored.decoded_on_read`), so it waits for the first pass to be done.
        archiving = (
            None
            if self._archiver is None
            else asyncio.create_task(
                self._archive_after_first_pass(self._archiver, fence, election.lost()),
                name="gpufed-archiver",
            )
        )
        compacting = (
            None
            if self._compactor is None
            else asyncio.create_task(self._compactor.run(fence, election.lost()), name="gpufed-compactor")
        )
        try:
            await self._loop(scheduler, reconciler, fence, election.lost())
        finally:
            # The reconciler's work in flight (dispatches, ended attempts) belongs to this term.
            await reconciler.stop()
            for task in (archiving, compacting):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            self.metrics.is_leader.set(0)
            self.first_pass_done = False
            if self._stager is not None:
                # Only the leader copies: a deposed one stops its syncs; the next leader resumes them.
                await self._stager.stop()
        log.warning("leadership_lost", identity=self.config.identity)

    async def _stand_by(self, scheduler: Scheduler, election: LeaderElection) -> Fence:
        """Wait to lead, keeping the scheduler's per-job requests built meanwhile, so that a
        takeover's first cycle does not build them all (`Scheduler.stand_by`). Never cancels a
        warm-up half-way: the first cycle must not run beside it."""
        acquiring = asyncio.ensure_future(election.acquire())
        try:
            while True:
                began = time.monotonic()
                try:
                    await scheduler.stand_by()
                except GpufedError as error:  # etcd away: the inputs are read again next time
                    log.warning("standby_warm_failed", error=str(error))
                # At most a tenth of the standby's time, however deep the queue.
                wait_s = max(STANDBY_WARM_S, 10 * (time.monotonic() - began))
                done, _ = await asyncio.wait({acquiring}, timeout=wait_s)
                if done:
                    return acquiring.result()
        finally:
            if not acquiring.done():
                acquiring.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await acquiring

    async def _archive_after_first_pass(self, archiver: Archiver, fence: Fence, lost: asyncio.Event) -> None:
        # At most a while: a leader whose cycles keep failing must still keep etcd small.
        deadline = time.monotonic() + ARCHIVE_WAITS_FOR_FIRST_PASS_S
        while not self.first_pass_done and time.monotonic() < deadline:
            if lost.is_set():
                return
            await asyncio.sleep(0.1)
        await archiver.run(fence, lost)

    async def _loop(
        self, scheduler: Scheduler, reconciler: Reconciler, fence: Fence, lost: asyncio.Event
    ) -> None:
        assert self._cache is not None
        changes = self._cache.subscribe()
        try:
            while not lost.is_set():
                started = time.monotonic()
                cycle_s = 0.0
                try:
                    first_cycle_s = None
                    if not self.first_pass_done:
                        # A new term plans before its first tick: the tick works through whatever
                        # piled up while no one led (ends to record, each reading its pods' logs;
                        # gangs to create), which took 3 to 5 s in the failover soak at 100 jobs/s,
                        # and queued jobs would have waited that long for the first admission. The
                        # cycle needs nothing from the tick: it reads the clusters itself.
                        first_cycle = await scheduler.run_cycle(fence)
                        first_cycle_s = round(time.monotonic() - started, 3)
                        log.info(
                            "leader_first_cycle_done",
                            seconds=first_cycle_s,
                            cpu_s=round(time.process_time(), 3),
                            admitted=first_cycle.admitted,
                        )
                    ticked = time.monotonic()
                    await reconciler.tick(fence)
                    tick_s = time.monotonic() - ticked
                    cycle_s = (await scheduler.run_cycle(fence)).seconds
                    if self._capacity is not None:
                        await self._capacity.tick(fence)
                    if not self.first_pass_done:
                        log.info(
                            "leader_first_pass_done",
                            seconds=round(time.monotonic() - started, 3),
                            first_cycle_s=first_cycle_s,
                            tick_s=round(tick_s, 3),
                            cpu_s=round(time.process_time(), 3),
                        )
                    self.first_pass_done = True
                except GpufedError as error:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        # stop() cancelled us mid-call and a client library turned that into its own
                        # error: retrying here would make the shutdown wait forever.
                        raise
                    # etcd or a cluster hiccup: nothing was half-written; try again next round,
                    # after a gap of three times the failed round (a backoff while etcd is away).
                    log.warning("cycle_failed", error=str(error), retryable=error.retryable)
                    cycle_s = time.monotonic() - started
                elapsed = time.monotonic() - started
                # Leave the API at least three quarters of the loop: with a long queue a cycle gets
                # expensive (its plan holds the GIL), and submissions must not wait behind
                # back-to-back cycles. The gap counts the cycle's cost only, not the reconciler's
                # tick: a tick's time is mostly waits on clusters and etcd, in which the API runs,
                # and it grows with the jobs in flight. Counted in, a tick that moved a thousand
                # jobs made the leader sit idle twice as long with every GPU it had just freed.
                # A leader that lost its lease stops at once, not after the gap: after a failed
                # round of 10 s (etcd without a quorum) the gap is 20 s, and a server that had lost
                # its lease in the outage went on sleeping that long after etcd was back, scheduling
                # nothing, before it stood for leader again (tests/e2e/test_etcd_cluster_outage.py).
                with contextlib.suppress(TimeoutError):
                    gap_s = max(0.0, max(self.config.min_cycle_gap_s, 3 * cycle_s) - elapsed)
                    await asyncio.wait_for(lost.wait(), timeout=gap_s)
                if lost.is_set():
                    break
                # Sleep until a job changes or the interval passes, whichever is first.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changes.get(), timeout=self.config.cycle_interval_s)
                while not changes.empty():
                    changes.get_nowait()
        finally:
            self._cache.unsubscribe(changes)

    async def _keep_heap(self) -> None:
        """Freezes the long-lived heap as the job cache grows (`federation.runtime.heap`)."""
        freezer = HeapFreezer()
        while True:
            await asyncio.sleep(HEAP_CHECK_S)
            if self._cache is not None:
                freezer.tick(self._cache.count())

    async def stop(self, grace_s: float = 2.0) -> None:
        if self._heap_task is not None:
            self._heap_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heap_task
        if self._leader_task is not None:
            self._leader_task.cancel()
            # Bounded: a stop that hangs is worse than one that leaves a stuck task behind (the
            # fence makes whatever it still writes harmless once the lease is gone).
            done, _ = await asyncio.wait({self._leader_task}, timeout=LEADER_STOP_TIMEOUT_S)
            if not done:
                log.error("leader_task_stuck", waited_s=LEADER_STOP_TIMEOUT_S)
            else:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._leader_task
        if self._http is not None:
            # First: open event streams end, so the rest stops without a browser holding it up.
            await self._http.cleanup()
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
        if self._election is not None:
            with contextlib.suppress(GpufedError):
                await self._election.resign()
            await self._election.close()
        if self._cache is not None:
            await self._cache.stop()
        if self._ledger is not None:
            await self._ledger.stop()
        if self._stager is not None:
            await self._stager.stop()
        if self._stores is not None:
            await self._stores.close()
        if self._executors is not None:
            await self._executors.close()
        if self._capacity is not None:
            await self._capacity.close()
        if self.members is not None:
            await self.members.close()
        if self._kv is not None:
            await self._kv.close()
        if self._archived_usage is not None:
            await self._archived_usage.close()
        if self.history is not None:
            self.history.close()
        log.info("server_stopped", identity=self.config.identity)

    async def wait(self) -> None:
        assert self._grpc is not None
        await self._grpc.wait_for_termination()
