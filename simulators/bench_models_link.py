"""What fencing the merger costs: a global model's publish (one transaction) against a
replica state's (a plain send + flush), same size, same broker, alternating.

    python -m simulators.bench_models_link --publishes 200 --state-kb 150 --interval-s 0.25

Both go through :class:`~streamlearn.sync.kafka_link.KafkaModelLink` as the hub
calls it (the merger's ``send(b"global", …)`` and a replica's
``send(b"replica/<id>", …)``), with the chunking of a real state of ``--state-kb``
(150 KB is a SynNonSep LinUCB state). It prints the median and 95th-percentile
milliseconds of each and their ratio. Without ``--bootstrap`` a broker is
started with deploy/kafka/kafka.sh and stopped at the end.
"""

from __future__ import annotations

import argparse
import time
import uuid
from contextlib import ExitStack

import numpy as np

from simulators.bench_daemon import start_broker
from streamlearn.sync.codec import chunk
from streamlearn.sync.kafka_link import KafkaModelLink, ensure_models_topic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="HOST:PORT of a running broker (default: start one)")
    parser.add_argument("--publishes", type=int, default=200, help="of each kind (default 200)")
    parser.add_argument("--state-kb", type=int, default=150, help="state size (default 150)")
    parser.add_argument("--interval-s", type=float, default=0.25,
                        help="between publishes of a kind, as the sync interval (default 0.25)")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        bootstrap = args.bootstrap or start_broker(stack)
        topic = f"models-bench-{uuid.uuid4().hex[:8]}"
        ensure_models_topic(bootstrap, topic)
        link = KafkaModelLink(bootstrap, topic)
        stack.callback(link.close)
        values = chunk({"kind": "global", "version": 1}, bytes(args.state_kb * 1024))
        times: dict[str, list[float]] = {"replica state (plain)": [],
                                         "global model (transaction)": []}
        keys = dict(zip(times, (b"replica/bench", b"global"), strict=True))
        for i in range(args.publishes + 5):  # alternating, the first 5 of each not counted
            for name, key in keys.items():
                began = time.perf_counter()
                link.send(key, values)
                if i >= 5:
                    times[name].append((time.perf_counter() - began) * 1000.0)
                time.sleep(args.interval_s / 2)
            if (i + 1) % 50 == 0:
                print(f"  {i + 1}/{args.publishes + 5} publishes of each", flush=True)
        print(f"broker {bootstrap}; {args.publishes} publishes of each, {len(values)} chunk(s) "
              f"of a {args.state_kb} KB state, one of each kind every {args.interval_s} s:")
        medians = {}
        for name, ms in times.items():
            medians[name] = float(np.median(ms))
            print(f"  {name:<28} median {medians[name]:6.1f} ms, "
                  f"p95 {float(np.percentile(ms, 95)):6.1f} ms")
        plain, txn = medians.values()
        print(f"  transaction / plain (median): {txn / plain:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
