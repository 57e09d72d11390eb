"""A plugin module for tests/test_tune.py (``plugins=[slow_end]``): a run's end takes a second
before its final checkpoint and result.json, as a big model's would, so that a trial whose
process Tune ended at once would lose them."""
import time

import flowkit


@flowkit.hookimpl(tryfirst=True)
def flowkit_on_train_end():
    time.sleep(1.0)
