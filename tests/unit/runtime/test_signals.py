"""`signals.StopRequest`: a real SIGTERM caught, handlers given back,
nothing outside the main thread."""

from __future__ import annotations

import os
import signal
import threading

from xla_mnist.runtime import signals


def test_stop_request_catches_a_real_sigterm_then_steps_aside():
  received = []

  def previous(signum, frame):
    received.append(signum)

  old_int = signal.getsignal(signal.SIGINT)
  old_term = signal.signal(signal.SIGTERM, previous)
  try:
    with signals.StopRequest() as stop:
      assert stop.signum == 0
      assert signal.getsignal(signal.SIGTERM) is not previous
      os.kill(os.getpid(), signal.SIGTERM)
      assert stop.signum == signal.SIGTERM
      assert received == []
      # The first signal put the handlers back: a second one acts as usual.
      assert signal.getsignal(signal.SIGTERM) is previous
      os.kill(os.getpid(), signal.SIGTERM)
      assert received == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is old_int
  finally:
    signal.signal(signal.SIGTERM, old_term)


def test_stop_request_restores_handlers_when_no_signal_came():
  before = {s: signal.getsignal(s) for s in signals.StopRequest.SIGNALS}
  with signals.StopRequest():
    pass
  after = {s: signal.getsignal(s) for s in signals.StopRequest.SIGNALS}
  assert after == before


def test_stop_request_outside_the_main_thread_does_nothing():
  outcome = []

  def body():
    with signals.StopRequest() as stop:
      outcome.append(stop.signum)

  thread = threading.Thread(target=body)
  thread.start()
  thread.join()
  assert outcome == [0]
