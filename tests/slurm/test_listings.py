"""When the last full job listing began (app.slurm.listings), in the ledger's clock: read
from that clock when the listing starts, never worked out from the monotonic clock's age
of it (the two drift apart: the wall clock is set, the monotonic one is not)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.core.slurm_models import Listing, SlurmJob, SlurmNode
from app.slurm.listings import ListingReader
from app.slurm.state import SlurmState
from tests.support.fake_slurm import slurm_node

LISTED = datetime(2026, 11, 27, 1, 0, tzinfo=UTC)


class Clocks:
    """A ledger clock and a monotonic one that each move only when told."""

    def __init__(self) -> None:
        self.wall = LISTED
        self.mono = 100.0

    def clock(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


class ListingClient:
    """Answers the listings; ``jobs_unchanged``: the job listing is a 304."""

    def __init__(self, clocks: Clocks) -> None:
        self.clocks = clocks
        self.jobs_unchanged = False

    def get_nodes(self, update_time: int | None = None) -> Listing[SlurmNode]:
        return Listing((slurm_node(),), 1)

    def get_jobs(self, update_time: int | None = None) -> Listing[SlurmJob] | None:
        # The listing takes a minute, and the wall clock is set back an hour meanwhile.
        self.clocks.mono += 60
        self.clocks.wall -= timedelta(hours=1)
        return None if self.jobs_unchanged else Listing((), 1)

    def started_at(self) -> int:
        return 1


@pytest.mark.parametrize("background", [False, True], ids=["in-step", "background"])
def test_the_job_listing_time_is_the_ledger_clocks_when_it_began(background: bool) -> None:
    clocks = Clocks()
    client = ListingClient(clocks)
    reader = ListingReader(
        client,  # type: ignore[arg-type]
        SlurmState(),
        full_sync_interval=30.0 if background else None,
        monotonic=clocks.monotonic,
        clock=clocks.clock,
    )
    assert reader.jobs_listed_at is None
    reader.read(1)
    if background:
        assert reader.pending is not None
        reader.pending.result()
        reader.read(1)  # applied at the next step
    assert reader.jobs_listed_at == LISTED

    client.jobs_unchanged = True  # a 304 leaves it where the last full listing put it
    if background:
        reader.force_full()
        reader.read(1)
        assert reader.pending is not None
        reader.pending.result()
    reader.read(1)
    reader.close()
    assert reader.jobs_listed_at == LISTED
