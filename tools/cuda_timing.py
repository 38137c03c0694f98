"""Timing shared by the PyTorch benchmark scripts: CUDA events (bench_attention.py,
bench_resnet_ops.py), the same median of event-timed calls after warm-up as bench/gpu_timer.h
on the C++ side; and the host clock (bench_sort_torch.py, bench_interpolate_torch.py), as
bench::time_median in bench/bench_util.h."""
import statistics
import time


def median_ms(fn, warmup, reps):
    """Median milliseconds of the GPU work fn() queues, after `warmup` untimed calls."""
    import torch  # imported here: the callers report a missing PyTorch themselves

    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def host_median_ms(fn, reps, sync, warmup=3):
    """Median milliseconds of fn() by the host clock, each call followed by sync() (a CUDA
    synchronize, or nothing on the CPU), after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
        sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)
