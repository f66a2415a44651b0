"""What a host made at start-up leaves the cyclic collector's passes once it serves."""

import gc

from supervisor.cli.common import freeze_start_up


def test_start_up_objects_are_left_out_of_the_collectors_passes():
    made_at_start_up = [[i] for i in range(1000)]  # lists: always tracked by the collector
    gc.collect()
    before = gc.get_freeze_count()
    try:
        freeze_start_up()
        assert gc.get_freeze_count() >= before + len(made_at_start_up)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
