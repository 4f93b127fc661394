"""Everything a decision reads that changes while the process runs: config, snapshot, index, ledger.

The request path reads attributes of this object and never awaits anything here except the one
bounded ledger round trip. Swapping is by plain assignment (one event loop, no locks needed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hami import config as config_mod
from hami.config import Config
from hami.observability import CONFIG_RELOADS, get_logger
from hami.placement.frag import FragModel
from hami.placement.index import PlacementIndex, build_index
from hami.placement.settings import PlacementSettings
from hami.placement.shapes_seen import ShapeTracker
from hami.queue import GateKeeper, start_gatekeeper
from hami.settings_loader import SettingsError
from hami.state.collector import StateLayer, start_state
from hami.state.ledger import InProcessLedger, Ledger, merge_overlays
from hami.state.model import EMPTY_SNAPSHOT, DeviceUsage, Snapshot
from hami.validation import NamespaceUsage

log = get_logger("hami.runtime")
SHAPES_REFRESH_EVERY = 200  # placements between two updates of frag's reference mix
INDEX_YIELD_EVERY = 64  # nodes moved in the placement index between two yields to the event loop


def placement_settings(config: Config) -> PlacementSettings:
    """Placement follows the state layer's degradation mode: one setting, not two to keep in step."""
    return dataclasses.replace(config.placement, degradation=config.state.degradation)


class Runtime:
    def __init__(self, config: Config, config_path: str | None = None, overrides: dict[str, Any] | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self._overrides = overrides or {}
        self._config_signature = self._signature()
        self.state: StateLayer | None = None
        self.ledger: Ledger = InProcessLedger(config.state.ledger)  # replaced by the state layer's on start
        self.placement_index: PlacementIndex = build_index(EMPTY_SNAPSHOT, placement_settings(config))
        self.shapes = ShapeTracker()  # what frag measures fragmentation against
        # Reservation key -> usage of a pick baked into the index while its ledger call is in flight.
        self.pending: dict[str, Mapping[str, DeviceUsage]] = {}
        self._shapes_applied = 0
        self._overlay_synced_at = float("-inf")  # monotonic time of the index's last ledger sync
        self._pending_snapshot: Snapshot | None = None
        self._index_task: asyncio.Task[None] | None = None
        self.gatekeeper: GateKeeper | None = None  # queue mode: ungates gated pods (hami/queue.py)
        # Called after each snapshot is applied to the index (the server freezes the GC there).
        self.on_index_updated: list[Callable[[], None]] = []

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self.adopt(await start_state(self.config.state))

    def adopt(self, layer: StateLayer) -> None:
        """Decide on an already started state layer (the drills build theirs around real agents)."""
        self.state = layer
        self.ledger = layer.ledger
        layer.collector.on_snapshot.append(self.on_snapshot)
        # -- queue mode (hami/queue.py): after each snapshot, in its own task, ungate pods that now fit.
        self.gatekeeper = start_gatekeeper(self, layer.collector.inventory, layer.collector.on_snapshot)
        if layer.collector.ready:
            self.apply_snapshot(layer.collector.snapshot)

    async def stop(self) -> None:
        if self._index_task is not None:
            self._index_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._index_task
        if self.gatekeeper is not None:  # queue mode: before the inventory it patches through closes
            await self.gatekeeper.close()
        if self.state is not None:
            await self.state.close()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        snapshot = self.snapshot
        # Ready once placement can use the first snapshot, not merely once it exists.
        ready = self.state is not None and self.state.collector.ready and self.placement_index.snapshot.version > 0
        return ready, {"snapshot_version": snapshot.version, "nodes": len(snapshot.nodes)}

    @property
    def snapshot(self) -> Snapshot:
        return self.state.collector.snapshot if self.state is not None else EMPTY_SNAPSHOT

    # -- derived state, rebuilt in the background --------------------------------------------
    def on_snapshot(self, snapshot: Snapshot) -> None:
        """Collector hook: follow the new snapshot in a background task, never on a request."""
        self._pending_snapshot = snapshot
        if self._index_task is None or self._index_task.done():
            self._index_task = asyncio.create_task(self._follow_snapshots())

    async def _follow_snapshots(self) -> None:
        while self._pending_snapshot is not None:  # a snapshot that came meanwhile is taken next
            snapshot, self._pending_snapshot = self._pending_snapshot, None
            try:
                await self._update_index(snapshot)
            except Exception as exc:  # the old index keeps serving; the next snapshot retries
                log.exception("placement_index_update_failed", error=repr(exc))
                continue
            for hook in self.on_index_updated:
                hook()

    async def _update_index(self, snapshot: Snapshot) -> None:
        """Changed nodes are moved between classes in place, yielding to admissions every few
        nodes; only a changed node *set* rebuilds. A refresh of a 10,000-node cluster costs the
        nodes that changed, spread over many short steps of the event loop."""
        index = self.placement_index
        if set(index.nodes) != {n.name for n in snapshot.nodes}:
            self.apply_snapshot(snapshot)
            return
        for i, node in enumerate(snapshot.nodes):
            if i % INDEX_YIELD_EVERY == INDEX_YIELD_EVERY - 1:
                await asyncio.sleep(0)
            old = index.nodes.get(node.name)
            # A new reading carries a new observed_at: unequal without comparing every GPU's fields.
            if old is not node and (old is None or old.observed_at != node.observed_at or old != node):
                index.update_node(node)
        index.snapshot = snapshot
        self.sync_overlay(force=True)  # expiries and releases since: off the request path
        self._refresh_shape_mix()

    def _refresh_shape_mix(self) -> None:
        """frag's reference mix, learned from placed pods, every SHAPES_REFRESH_EVERY placements."""
        if self.shapes.seen - self._shapes_applied < SHAPES_REFRESH_EVERY:
            return
        self._shapes_applied = self.shapes.seen
        mix = self.shapes.mix(self.config.placement.frag_threshold_pct)
        if mix is not None:
            index = self.placement_index
            index.shapes = mix
            index.sctx = dataclasses.replace(index.sctx, frag=FragModel(mix))

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """The index for `snapshot`, built at once (start-up, review, a changed node set)."""
        self.placement_index = build_index(snapshot, placement_settings(self.config), self.placement_index.shapes)
        self.sync_overlay(force=True)  # a new index starts without the ledger's reservations

    def on_config_reloaded(self) -> None:
        self.placement_index = build_index(self.snapshot, placement_settings(self.config), self.placement_index.shapes)
        self.sync_overlay(force=True)

    def sync_overlay(self, *, force: bool = False) -> None:
        """Make the index's applied reservations equal to the ledger's overlay (expiries, releases,
        other replicas' reservations). O(overlay), so the request path calls it unforced and it runs
        at most every `overlay_sync_s`; between two syncs the index only ever over-counts (its own
        reservations are added at once by the Decider, releases wait), which is conservative."""
        now = time.monotonic()
        index = self.placement_index
        if not force and now - self._overlay_synced_at < index.settings.overlay_sync_s:
            return
        self._overlay_synced_at = now
        overlay = self.ledger.overlay()
        if self.pending:
            # Picks awaiting the ledger must stay counted, but only those its overlay lacks: a Redis
            # refresh (another admission's refusal triggers one) can read a reservation the script
            # has written before its reserve() returns, and counting it twice would deny pods that fit.
            waiting = [usage for key, usage in self.pending.items() if not self.ledger.holds(key)]
            if waiting:
                overlay = merge_overlays(overlay, *waiting)
        index.sync_overlay(overlay)

    def namespace_usage(self, namespace: str) -> NamespaceUsage:
        """GPU use counted against the namespace's quota: pending reservations (what this and the
        other replicas admitted) plus bound pods from the pod watch, when there is one. A pod is in
        one of the two only: its reservation is released once the watch has seen it bound."""
        usage = self.ledger.namespace_usage(namespace)
        bound = self.state.collector.allocation_source if self.state is not None else None
        return usage + bound.namespace_usage(namespace) if bound is not None else usage

    # -- config hot reload -------------------------------------------------------------------
    def _signature(self) -> tuple[int, int, int] | None:
        if not self.config_path:
            return None
        try:
            st = os.stat(self.config_path)  # follows the ConfigMap's ..data symlink
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def maybe_reload_config(self) -> bool:
        """Take a changed file's policy sections; a bad file keeps the old policy and says so."""
        signature = self._signature()
        if signature is None or signature == self._config_signature:
            return False
        self._config_signature = signature
        try:
            fresh = config_mod.load(Path(self.config_path or ""), overrides=self._overrides)
        except SettingsError as exc:
            CONFIG_RELOADS.labels(result="error").inc()
            log.error("config_reload_rejected", path=self.config_path, error=str(exc), kept="previous policy")
            return False
        self.config, restart = config_mod.with_policy_of(self.config, fresh)
        CONFIG_RELOADS.labels(result="ok").inc()
        log.info("config_reloaded", path=self.config_path, restart_needed_for=restart or None)
        self.on_config_reloaded()
        return True
