"""Is slurmctld set up to share nodes safely? The check of its plugins.

From Slurm 25.11 on, slurmctld drains a node INVAL at a periodic re-registration when a
runtime k8scpu/k8smemory count differs from what jobs use (measured on 26.05.3: "gres/
k8scpu count changed and jobs are using them (16 != 7)"), unless
``node_features/k8s_resources`` (slurm-plugins/) marks those GRES as node features; without
it 2 of 5 race runs oversubscribed. On 24.11 it is not needed: lowering a count never
drains there. So on >= 25.11 the service fails closed: new admissions are refused with the
reason while slurmctld runs without the plugin; /readyz is degraded, the metric
``nodeledger_slurm_plugins_ok`` is 0, and one ERROR line says why (an INFO line when fixed).

On every release ``job_submit/k8s_resource_completion`` must run too (else jobs ask for
none of what pods hold); it is checked wherever slurmrestd can say.

slurmrestd says which plugins slurmctld loaded from API v0.0.45 on (Slurm 26.05,
``GET /slurm/v0.0.45/conf``: ``NodeFeaturesPlugins``, ``JobSubmitPlugins``). Slurm 25.11's
slurmrestd (v0.0.44) has no such endpoint: there the check cannot see, and
``plugin_check`` decides (docs/configuration.md). 24.11's cannot either, and needs no
node_features plugin.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.core.components import Health
from app.loops import Loop
from app.metrics.registry import NO_METRICS, Metrics
from app.slurm.client import SlurmClient
from app.slurm.errors import SlurmError, SlurmUnavailable

log = logging.getLogger(__name__)
PLUGIN = "node_features/k8s_resources"
JOB_SUBMIT = "job_submit/k8s_resource_completion"
REQUIRED_FROM = (25, 11)  # the first release whose re-registration drains without it
PluginCheckMode = Literal["enforce", "warn", "off"]


@dataclass(frozen=True, slots=True)
class PluginStatus:
    """Whether slurmctld's plugins make sharing nodes safe, and the line that says so."""

    safe: bool
    message: str


def plugin_status(
    release: str, node_features_plugins: list[str] | None, job_submit_plugins: list[str] | None
) -> PluginStatus:
    """Pure: is a slurmctld of ``release`` with these NodeFeaturesPlugins and
    JobSubmitPlugins (None: slurmrestd cannot say) safe to share nodes with?"""
    problems = [p for p in (_node_features(release, node_features_plugins),) if p]
    submit = [p.removeprefix("job_submit/") for p in job_submit_plugins or ()]
    if job_submit_plugins is not None and JOB_SUBMIT.removeprefix("job_submit/") not in submit:
        # Every release: without it jobs ask for no k8s GRES and land on what pods hold.
        problems.append(
            f"slurmctld (Slurm {release}) runs without JobSubmitPlugins={JOB_SUBMIT} (loaded: "
            f"{', '.join(job_submit_plugins) or 'none'}): jobs then ask for none of what "
            "pods hold"
        )
    if not problems:
        return PluginStatus(True, f"Slurm {release}: {_needed(release)}")
    fix = "add the plugins (docs/slurm.md#the-plugins) and reconfigure slurmctld"
    return PluginStatus(False, "; ".join(problems) + f"; so nodes cannot be shared safely: {fix}")


def _new(release: str) -> bool:
    try:
        major, minor = (int(part) for part in release.split(".")[:2])
    except ValueError:
        return True  # an unknown release is treated as a new one
    return (major, minor) >= REQUIRED_FROM


def _needed(release: str) -> str:
    return f"{PLUGIN} loaded" if _new(release) else f"{PLUGIN} not required"


def _node_features(release: str, loaded: list[str] | None) -> str | None:
    """What is wrong with slurmctld's NodeFeaturesPlugins, or None."""
    if not _new(release):
        return None
    if loaded is None:
        return (
            f"Slurm {release} needs NodeFeaturesPlugins={PLUGIN} and its slurmrestd cannot "
            "say whether slurmctld loaded it (no /conf before API v0.0.45): once it is "
            "configured, set NODELEDGER_SLURM_PLUGIN_CHECK=warn (chart: slurm.pluginCheck=warn)"
        )
    if PLUGIN in loaded:
        return None
    return (
        f"slurmctld (Slurm {release}) runs without NodeFeaturesPlugins={PLUGIN} (loaded: "
        f"{', '.join(loaded) or 'none'}): from 25.11 on it drains a node INVAL when a "
        "runtime k8s* count changes while jobs use them"
    )


class PluginCheck:
    """Component: checks at start and every ``interval`` seconds (a reconfigure may change
    the plugins); ``refusal()`` is what the admission gate asks."""

    name = "slurm-plugins"

    def __init__(
        self,
        client: SlurmClient,
        *,
        mode: PluginCheckMode = "enforce",
        interval: float = 60.0,
        metrics: Metrics = NO_METRICS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.mode = mode
        self.interval = interval
        self.metrics = metrics
        self.monotonic = monotonic
        self.status: PluginStatus | None = None  # None: not checked yet, or Slurm unreachable
        self._loop = Loop(
            "slurm-plugins", self._recheck, interval=interval, logger=log, what="Slurm plugin check"
        )
        self._last_error = ""  # the last failure of the check logged, not an outage

    def check(self) -> PluginStatus | None:
        """Ask slurmrestd once; None when it cannot be reached (the sync says so)."""
        try:
            release, plugins = self.client.plugins()
        except SlurmUnavailable as exc:  # the outage is logged once, by the client
            log.debug("checking Slurm's plugins: %s", exc)
            return self.status
        except SlurmError as exc:  # e.g. a 403 on /conf: the check cannot work, say why
            if str(exc) != self._last_error:
                log.warning("checking Slurm's plugins failed: %s", exc)
                self._last_error = str(exc)
            return self.status
        self._last_error = ""
        node_features = plugins.get("NodeFeaturesPlugins")
        found = plugin_status(release, node_features, plugins.get("JobSubmitPlugins"))
        if found != self.status:
            if found.safe:
                log.info("Slurm plugin check: %s", found.message)
            else:
                action = "refusing new admissions" if self.mode == "enforce" else "warning only"
                log.error("Slurm plugin check (%s): %s", action, found.message)
            self.metrics.slurm_plugins(found.safe)
        self.status = found
        return found

    def refusal(self) -> str | None:
        """Why admissions are refused now (mode enforce and an unsafe slurmctld), or None."""
        if self.mode != "enforce" or self.status is None or self.status.safe:
            return None
        return self.status.message

    # Component

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(timeout=30)

    def health(self) -> Health:
        if self.status is None:
            return Health("ok", "not checked yet")
        return Health("ok" if self.status.safe else "degraded", self.status.message)

    def _recheck(self) -> None:
        self.check()
