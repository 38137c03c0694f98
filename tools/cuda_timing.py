"""CUDA-event timing shared by the PyTorch benchmark scripts (bench_attention.py,
bench_resnet_ops.py): the same median of event-timed calls after warm-up as
bench/gpu_timer.h on the C++ side."""
import statistics


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
