"""The one retry schedule (omniwatch.backoff) and the three places that retry with it."""
from __future__ import annotations

from omniwatch import backoff

def test_doubles_from_initial_and_caps():
    assert [backoff.delay(k, 1.0, 60.0) for k in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.delay(10_000, 2.0, 60.0) == 60.0  # no overflow however long it failed
    assert backoff.delay(-3, 1.0, 60.0) == 1.0

def test_jitter_stays_between_half_and_all():
    got = [backoff.delay(3, 1.0, 60.0, jitter=True) for _ in range(500)]
    assert min(got) >= 4.0 and max(got) <= 8.0 and max(got) - min(got) > 1.0

def test_gpu_sampler_reopens_nvml_on_the_schedule_and_resets_after_a_good_poll():
    from omniwatch.gpu.devices import GpuUnavailable
    from omniwatch.gpu.sampler import GpuSampler

    class Flaky:
        opens = 0

        def open(self):
            Flaky.opens += 1
            raise GpuUnavailable("driver not loaded")

        def close(self):
            pass

    now = [0.0]
    s = GpuSampler(Flaky(), node="n", clock=lambda: now[0])
    waits = []
    for _ in range(5):
        s.poll_once()
        waits.append(s.next_open_at - now[0])
        now[0] = s.next_open_at
    assert waits == [1, 2, 4, 8, 16] and Flaky.opens == 5
