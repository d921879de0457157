"""The Ray peer of bench/compare-remote-actors: a Python actor that echoes an 8-byte payload,
called synchronously with ray.get in a loop from the driver (another process).

Usage: ray_echo.py SECONDS
  -> prints `result calls=N calls_per_s=X p50_us=Y p99_us=Z csw_per_call=C` (C: the driver's)
Ray runs with its defaults, a local cluster started here (no dashboard); the actor is the
only task.
"""
import os
import resource
import sys
import time

import ray


@ray.remote
class Echo:
    def echo(self, x):
        return x


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             num_cpus=max(1, len(os.sched_getaffinity(0))))
    actor = Echo.remote()
    for i in range(300):  # warm-up: actor started, connections and caches hot
        assert ray.get(actor.echo.remote(i.to_bytes(8, "little"))) == i.to_bytes(8, "little")
    lat = []
    ru = resource.getrusage(resource.RUSAGE_SELF)
    csw0 = ru.ru_nvcsw + ru.ru_nivcsw
    start = time.perf_counter()
    end = start + seconds
    now = start
    i = 0
    while now < end:
        payload = (i * 7919).to_bytes(8, "little")
        t0 = time.perf_counter()
        if ray.get(actor.echo.remote(payload)) != payload:
            print("result error=wrong_reply", flush=True)
            return 1
        now = time.perf_counter()
        lat.append((now - t0) * 1e6)
        i += 1
    ru = resource.getrusage(resource.RUSAGE_SELF)
    csw = ru.ru_nvcsw + ru.ru_nivcsw - csw0
    lat.sort()
    n = len(lat)
    print(f"result calls={n} calls_per_s={n / (now - start):.1f} p50_us={lat[n // 2]:.2f} "
          f"p99_us={lat[min(n - 1, n * 99 // 100)]:.2f} csw_per_call={csw / n:.2f}", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
