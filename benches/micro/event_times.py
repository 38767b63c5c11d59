"""The timing both micro scripts share (`v2_rows.py`, `g8_rows.py`): CUDA events around
repeated launches on CuPy's current stream."""
import cupy as cp


def event_times(run, reps, warmup=0, rounds=5):
    """Calls `run()` `warmup` times, then `rounds` rounds of `reps` calls, each round between
    two CUDA events; returns the fastest round's and the median round's microseconds a call."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(rounds):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(reps):
            run()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / reps * 1000)
    times.sort()
    return times[0], times[len(times) // 2]
