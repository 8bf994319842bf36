"""deploy/kafka/kafka.sh: the cluster ids it formats a new broker with."""

from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path

KAFKA_SH = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "kafka.sh"


def test_cluster_ids_never_start_with_a_dash_over_many_draws() -> None:
    """An id starting with '-' made ``StorageTool format -t ID`` fail, one start in 64."""
    done = subprocess.run([str(KAFKA_SH), "cluster-id", "--count", "300"], capture_output=True,
                          text=True, check=True, timeout=120)
    ids = done.stdout.split()
    assert len(ids) == len(set(ids)) == 300
    for cluster_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", cluster_id), cluster_id
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    # still random: with '-' excluded, 63 first characters are possible; 300 draws hit most
    # (a generator that let '-' lead one draw in 64 would pass 300 draws with probability 0.9 %)
    assert len({i[0] for i in ids}) > 50


def test_start_formats_with_the_checked_generator() -> None:
    script = KAFKA_SH.read_text()
    assert script.count("/dev/urandom") == 1  # one generator, the one tested above
    assert 'cluster_id="$(new_cluster_id)"' in script


def test_cluster_id_count_must_be_a_number() -> None:
    done = subprocess.run([str(KAFKA_SH), "cluster-id", "--count", "x"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 1 and "expected --count as a whole number" in done.stderr
