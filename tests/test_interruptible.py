"""interruptible(): SIGTERM and SIGHUP stop a loop like Ctrl-C, unless this process was started with the signal
ignored (`nohup` ignores SIGHUP): then it stays ignored, inside the block and after it."""

import os
import signal

import pytest

from corescale.trials.local import STOP_SIGNALS, Interrupted, interruptible


@pytest.fixture
def restore_signals():
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", STOP_SIGNALS)
def test_a_stop_signal_raises_interrupted(restore_signals, sig):
    signal.signal(sig, signal.SIG_DFL)
    with pytest.raises(Interrupted) as stopped, interruptible():
        os.kill(os.getpid(), sig)
    assert stopped.value.signal_name == signal.Signals(sig).name
    assert signal.getsignal(sig) == signal.SIG_DFL  # put back as it was


@pytest.mark.parametrize("sig", STOP_SIGNALS)
def test_an_inherited_ignore_is_kept(restore_signals, sig):
    signal.signal(sig, signal.SIG_IGN)
    with interruptible(), interruptible():  # nested, as tune's loop around run_trial's
        assert signal.getsignal(sig) == signal.SIG_IGN
        os.kill(os.getpid(), sig)  # ignored: nothing raised
    assert signal.getsignal(sig) == signal.SIG_IGN


def test_ignoring_one_leaves_the_other_active(restore_signals):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with pytest.raises(Interrupted, match="SIGTERM"), interruptible():
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)
