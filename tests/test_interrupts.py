"""Interrupt handling: SIGTERM acts as Ctrl-C; inside a deferred block the first interrupt is
noted, the second calls the block's stop, and the handlers before the block come back after."""

import os
import signal

import pytest

from rig.interrupts import InterruptsDeferred, interrupts_held, interrupts_raise


class Stopped(Exception):
    """What the test's `stop` raises in place of ending the process."""


def _stop():
    raise Stopped


@pytest.fixture
def restore_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_sigterm_and_sighup_raise_keyboard_interrupt(restore_handlers):
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal starts it (not under nohup)
    interrupts_raise()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_first_interrupt_is_noted_and_the_second_stops(restore_handlers, capsys):
    interrupts_raise()
    with pytest.raises(Stopped), InterruptsDeferred("noted", _stop) as deferred:
        os.kill(os.getpid(), signal.SIGINT)
        assert deferred.received == signal.SIGINT
        assert capsys.readouterr().out == "noted\n"
        os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):  # the handlers from before the block are back
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_block_without_interrupts_notes_nothing(restore_handlers):
    with InterruptsDeferred("noted", _stop) as deferred:
        pass
    assert deferred.received is None


def test_a_held_interrupt_is_raised_when_the_block_ends(restore_handlers):
    interrupts_raise()
    finished = []
    with pytest.raises(KeyboardInterrupt), interrupts_held():
        os.kill(os.getpid(), signal.SIGTERM)
        finished.append(True)
    assert finished == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_held_interrupt_the_process_ignored_stays_ignored(restore_handlers):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with interrupts_held():
        os.kill(os.getpid(), signal.SIGHUP)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


def test_sigint_inherited_ignored_is_taken_and_sighup_under_nohup_stays_ignored(restore_handlers):
    """A script's background job starts with SIGINT ignored, `nohup` with SIGHUP ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    interrupts_raise()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)


def test_a_hold_waits_for_its_phase_only(restore_handlers, monkeypatch, capsys):
    from rig.interrupts import HOLD_VARIABLE, hold_at

    monkeypatch.setenv(HOLD_VARIABLE, "load")
    hold_at("replay")  # another phase: no hold
    assert capsys.readouterr().out == ""
    hold_at("load", released=lambda: True)
    assert "rig: holding at load until interrupted" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown phase"):
        hold_at("lunch")
