"""`gpufed dataset register|list|show|sync|status|evict|verify|grants|grant|lineage|outputs`: the dataset
registry, its copies, who may register what, and the versions jobs made (Datasets).

`sync` shows the plan first (bytes to copy, egress estimate), then asks the leader to run it; with
`--wait` it follows the progress (bytes, objects, rate, time left) until the copy is done or failed.
Jobs stage their data on their own: a job whose dataset is not in its cluster's store waits in STAGING
while the same kind of sync runs, and `gpufed dataset status NAME` shows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from federation.api.datasets_client import DatasetsClient
from federation.api.v1 import gpufed_pb2 as pb

POLL_S = 0.5


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def datasets_table(reply: pb.ListDatasetsResponse) -> str:
    rows = [("NAME", "TENANT", "HOME", "VERSIONS", "LATEST SIZE", "COPIES")]
    for d in reply.datasets:
        latest = max(d.versions, key=lambda v: v.created_at.ToNanoseconds(), default=None)
        rows.append(
            (
                d.name,
                d.tenant,
                d.home_store,
                ",".join(v.version for v in d.versions),
                human_bytes(latest.size_bytes) if latest else "-",
                ",".join(sorted({f"{c.store}:{c.version}" for c in d.copies})) or "-",
            )
        )
    return _table(rows)


def dataset_text(d: pb.DatasetInfo) -> str:
    lines = [f"dataset {d.name} (tenant {d.tenant}, home {d.home_store})"]
    if d.shared_with:
        lines.append(f"shared with: {', '.join(d.shared_with)}")
    for v in d.versions:
        lines.append(
            f"  version {v.version}: {v.store}/{v.prefix}  {human_bytes(v.size_bytes)} in {v.object_count} "
            f"objects  sha256 {v.manifest_digest[:16]}"
        )
    for c in d.copies:
        users = [
            *c.pinned_by,
            *([f"{c.pinned_by_others} job(s) of other tenants"] if c.pinned_by_others else []),
        ]
        pins = f"  pinned by {', '.join(users)}" if users else ""
        lines.append(f"  copy of {c.version} in {c.store}: {human_bytes(c.size_bytes)}{pins}")
    return "\n".join(lines)


def sync_text(s: pb.SyncStatus) -> str:
    p = s.progress
    eta = "?" if p.eta_s < 0 else f"{p.eta_s:.0f}s"
    head = (
        f"{s.dataset}@{s.version} {s.source_store or '?'} -> {s.store}: {s.state}; "
        f"{human_bytes(p.bytes_done)}/{human_bytes(p.bytes_total)}, "
        f"{p.objects_done}/{p.objects_total} objects, "
        f"{human_bytes(p.rate_bytes_per_s)}/s, {eta} left"
    )
    plan = (
        f"  plan: copy {human_bytes(s.bytes_to_copy)} in {s.objects_to_copy} objects; "
        f"egress ${s.egress_usd:.2f} at ${s.egress_usd_per_gb:.3f}/GB"
    )
    jobs = [*s.job_ids, *([f"{s.other_job_count} job(s) of other tenants"] if s.other_job_count else [])]
    extra = [f"  jobs: {', '.join(jobs)}"] if jobs else []
    if p.objects_up_to_date or p.objects_copied or p.objects_reused or p.objects_failed:
        extra.append(
            f"  objects: {p.objects_up_to_date} up to date, {p.objects_copied} copied, "
            f"{p.objects_reused} reused, {p.objects_failed} failed; bytes: "
            f"{human_bytes(p.bytes_transferred)} transferred, {human_bytes(p.bytes_server_copied)} copied "
            f"server-side, {human_bytes(p.bytes_reused)} reused, {human_bytes(p.bytes_resumed)} resumed"
        )
    if s.state == "done":
        extra.append(f"  copied {human_bytes(s.bytes_copied)}; verified: {'yes' if s.verified else 'no'}")
    if s.error:
        extra.append(f"  error: {s.error}")
    return "\n".join([head, plan, *extra])


def register(cli: click.Group, rpc: Callable[[Any], Any]) -> None:
    @cli.group()
    def dataset() -> None:
        """Datasets: versions with manifests in a home store, copies near clusters, syncs.

        Names are per tenant: NAME is your tenant's dataset, TENANT/NAME one another tenant shared
        with yours.
        """

    @dataset.command(name="register")
    @click.argument("ref", metavar="NAME@VERSION")
    @click.option("--store", required=True, help="the object store the data is in (its home)")
    @click.option("--prefix", required=True, help="the object prefix of this version, e.g. imagenet/v3/")
    @click.option("--share", "shared", multiple=True, help="a tenant that may use it too (repeatable)")
    @click.option("--tenant", default="", help="admins: register for this tenant")
    @click.pass_obj
    @rpc
    def register_cmd(
        opts: Any, ref: str, store: str, prefix: str, shared: tuple[str, ...], tenant: str
    ) -> None:
        """Hash every object under PREFIX into a manifest and register it as NAME@VERSION (a name in
        your tenant's namespace: another tenant's dataset of the same name is another dataset)."""
        name, _, version = ref.partition("@")
        with opts.client() as client:
            reply = DatasetsClient(client).register(
                name, version, store=store, prefix=prefix, shared_with=shared, tenant=tenant
            )
        opts.emit(
            reply,
            f"registered {reply.dataset}@{reply.version}: {human_bytes(reply.size_bytes)} in "
            f"{reply.object_count} objects (manifest sha256 {reply.manifest_digest[:16]})",
        )

    @dataset.command(name="list")
    @click.option("--tenant", default="", help="only this tenant's (admins and infra)")
    @click.pass_obj
    @rpc
    def list_cmd(opts: Any, tenant: str) -> None:
        """Datasets you may use: your tenant's and those shared with it (admins: all)."""
        with opts.client() as client:
            reply = DatasetsClient(client).list(tenant=tenant)
        opts.emit(reply, datasets_table(reply))

    @dataset.command(name="show")
    @click.argument("name")
    @click.pass_obj
    @rpc
    def show_cmd(opts: Any, name: str) -> None:
        """A dataset's versions (store, prefix, size, manifest) and its cached copies."""
        with opts.client() as client:
            reply = DatasetsClient(client).get(name)
        opts.emit(reply, dataset_text(reply))

    @dataset.command(name="sync")
    @click.argument("ref", metavar="NAME[@VERSION]")
    @click.option("--store", required=True, help="the store to copy into")
    @click.option("--dry-run", is_flag=True, help="only show the plan and the egress estimate")
    @click.option("--wait", is_flag=True, help="follow the progress until the copy is done")
    @click.pass_obj
    @rpc
    def sync_cmd(opts: Any, ref: str, store: str, dry_run: bool, wait: bool) -> None:
        """Copy a version into STORE (verified against its manifest), egress estimate first."""
        name, _, version = ref.partition("@")
        with opts.client() as client:
            datasets = DatasetsClient(client)
            plan = datasets.sync(name, store=store, version=version, dry_run=True)
            click.echo(sync_text(plan).splitlines()[1].strip(), err=opts.output != "table")
            if dry_run:
                opts.emit(plan, sync_text(plan))
                return
            status = datasets.sync(name, store=store, version=version)
            while wait and status.state in ("requested", "running"):
                time.sleep(POLL_S)
                found = [s for s in datasets.status(name, store=store).syncs if s.version == status.version]
                if found:
                    status = found[0]
                    if opts.output == "table":
                        click.echo(sync_text(status).splitlines()[0])
        opts.emit(status, sync_text(status))
        if status.state == "failed":
            raise click.exceptions.Exit(1)

    @dataset.command(name="status")
    @click.argument("name")
    @click.option("--store", default="", help="only the copy into this store")
    @click.pass_obj
    @rpc
    def status_cmd(opts: Any, name: str, store: str) -> None:
        """Syncs of a dataset, with progress, plan, the jobs waiting on them, and errors."""
        with opts.client() as client:
            reply = DatasetsClient(client).status(name, store=store)
        opts.emit(reply, "\n".join(sync_text(s) for s in reply.syncs) or f"no syncs of {name}")

    @dataset.command(name="evict")
    @click.argument("ref", metavar="NAME[@VERSION]")
    @click.option("--store", required=True, help="the store to delete the copy from")
    @click.pass_obj
    @rpc
    def evict_cmd(opts: Any, ref: str, store: str) -> None:
        """Delete a cached copy (never the home copy, never one a job is using)."""
        name, _, version = ref.partition("@")
        with opts.client() as client:
            reply = DatasetsClient(client).evict(name, store=store, version=version)
        opts.emit(reply, f"evicted {ref} from {store}: {human_bytes(reply.freed_bytes)} freed")

    @dataset.command(name="verify")
    @click.argument("ref", metavar="NAME[@VERSION]")
    @click.option("--store", required=True, help="the store holding the copy to check")
    @click.option("--repair/--no-repair", default=True, help="copy bad objects again (default: yes)")
    @click.pass_obj
    @rpc
    def verify_cmd(opts: Any, ref: str, store: str, repair: bool) -> None:
        """Re-read and re-hash every object of a copy against the version's manifest; repair what is bad."""
        name, _, version = ref.partition("@")
        with opts.client() as client:
            reply = DatasetsClient(client).verify(name, store=store, version=version, repair=repair)
        opts.emit(reply, verify_text(reply))
        if not reply.ok:
            raise SystemExit(1)

    @dataset.command(name="grants")
    @click.option("--store", default="", help="only this store")
    @click.option("--tenant", default="", help="only this tenant (admins and infra)")
    @click.pass_obj
    @rpc
    def grants_cmd(opts: Any, store: str, tenant: str) -> None:
        """The prefixes each tenant may register datasets under, per store."""
        with opts.client() as client:
            reply = DatasetsClient(client).grants(store=store, tenant=tenant)
        rows = [("STORE", "TENANT", "PREFIXES", "FROM")]
        rows += [(g.store, g.tenant, ",".join(g.prefixes) or "-", g.source) for g in reply.grants]
        opts.emit(reply, _table(rows))

    @dataset.command(name="grant")
    @click.argument("store")
    @click.argument("tenant")
    @click.argument("prefixes", nargs=-1)
    @click.pass_obj
    @rpc
    def grant_cmd(opts: Any, store: str, tenant: str, prefixes: tuple[str, ...]) -> None:
        """Admins: let TENANT register under PREFIXES in STORE (none: back to the config's). Audited."""
        with opts.client() as client:
            reply = DatasetsClient(client).set_grant(store=store, tenant=tenant, prefixes=prefixes)
        opts.emit(
            reply, f"{reply.tenant} in {reply.store}: {', '.join(reply.prefixes) or 'none'} ({reply.source})"
        )

    @dataset.command(name="lineage")
    @click.argument("ref", metavar="NAME[@VERSION]")
    @click.pass_obj
    @rpc
    def lineage_cmd(opts: Any, ref: str) -> None:
        """A version's ancestry (the inputs of the job that made it, and theirs) and its descendants
        (versions made by jobs that read it), as far as you may see: another tenant's versions are
        redacted among ancestors and only counted among descendants."""
        name, _, version = ref.partition("@")
        with opts.client() as client:
            reply = DatasetsClient(client).lineage(name, version=version)
        opts.emit(reply, lineage_text(reply))

    @dataset.command(name="outputs")
    @click.argument("job_id")
    @click.pass_obj
    @rpc
    def outputs_cmd(opts: Any, job_id: str) -> None:
        """What became of a job's declared outputs: pending, registered (as which version), or why not."""
        with opts.client() as client:
            reply = DatasetsClient(client).outputs(job_id)
        rows = [("DATASET", "VERSION", "STATE", "WHERE", "REASON")]
        rows += [
            (
                o.dataset,
                o.version,
                o.state,
                f"{o.store}:{o.prefix}" if o.store else o.prefix or "-",
                o.reason or "-",
            )
            for o in reply.outputs
        ]
        opts.emit(reply, _table(rows) if reply.outputs else f"job {reply.job_id} declares no outputs")


def _node_line(n: pb.LineageNode) -> str:
    indent = "  " * max(n.depth, 0)
    if n.redacted:
        return f"{indent}(redacted: a version you may not see)"
    line = f"{indent}{n.dataset}@{n.version}"
    if n.job_id:
        line += f"  made by job {n.job_id} (attempt {n.attempt}, {', '.join(n.images)})"
    elif not n.inputs:
        line += "  registered"
    return line


def lineage_text(r: pb.DatasetLineage) -> str:
    lines = [_node_line(r.version).strip()]
    if r.version.params:
        lines.append("  params: " + " ".join(r.version.params))
    lines.append("ancestors:" if r.ancestors else "ancestors: none")
    lines += [_node_line(n) for n in r.ancestors]
    lines.append("descendants:" if r.descendants or r.hidden_descendants else "descendants: none")
    lines += [_node_line(n) for n in r.descendants]
    if r.hidden_descendants:
        lines.append(f"  and {r.hidden_descendants} in datasets you may not see")
    return "\n".join(lines)


def verify_text(r: pb.VerifyDatasetResponse) -> str:
    head = f"{r.dataset}@{r.version} in {r.store}: {r.objects_checked} objects checked; "
    bad = len({*r.missing, *r.wrong_size, *r.wrong_hash})
    if not bad and not r.unexpected:
        return head + "all match the manifest"
    lines = [head + f"{bad} bad, {len(r.repaired)} repaired; {'whole now' if r.ok else 'STILL DAMAGED'}"]
    if r.unexpected:
        lines[0] += f"; {len(r.unexpected)} not of the version {'removed' if r.ok else 'left'}"
    lines += [f"  missing: {p}" for p in r.missing]
    lines += [f"  wrong size: {p}" for p in r.wrong_size]
    lines += [f"  wrong sha256: {p}" for p in r.wrong_hash]
    lines += [f"  unexpected: {p}" for p in r.unexpected]
    return "\n".join(lines)
