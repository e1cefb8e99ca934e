"""chexflow's kubernetes job backend runs steps in the trainer image on real pods, with a data
volume shared with the host."""

from __future__ import annotations

import io
import json

import pytest

from chexflow.jobs.kubernetes import KubernetesBackend
from chexflow.jobs.spec import JobSpec, Volume

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]


def test_batch_jobs_synthesize_and_preprocess_on_real_pods_into_the_shared_volume(
        k8s_api, real_namespace, trainer_image):
    ns, data = real_namespace
    log = io.StringIO()
    backend = KubernetesBackend(namespace=ns, api_client=k8s_api, image=trainer_image,
                                poll_seconds=1, stream=log)
    volume = [Volume("data", "/data")]
    synth = backend.run(JobSpec(
        name="synth", command=["chexflow", "data", "synth", "--out", "/data/raw", "--images",
                               "40", "--size", "64"], cpu="500m", memory="1Gi", volumes=volume,
        timeout_seconds=300))
    assert "wrote 40 images" in synth.log_tail
    assert len(list((data / "raw" / "images").glob("*.png"))) == 40
    prep = backend.run(JobSpec(
        name="preprocess", command=["chexflow", "preprocess", "--csv",
                                    "/data/raw/Data_Entry_2017.csv", "--images",
                                    "/data/raw/images", "--out", "/data/tfrecords",
                                    "--image-size", "64"],
        cpu="1", memory="2Gi", volumes=volume, timeout_seconds=600))
    manifest = json.loads((data / "tfrecords" / "manifest.json").read_text())
    assert sum(s["images"] for s in manifest["splits"].values()) == 40, manifest
    assert '"accepted": 40' in prep.log_tail
    assert list((data / "tfrecords" / "train").iterdir())
