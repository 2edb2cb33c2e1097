"""Submit and watch StrategyJobs from Python (and, through the same code, from the
``strategyjob`` command line). Torch-free; ``kubernetes`` is loaded only when a
:class:`StrategyJobClient` is created (``pip install 'strategyjob[client]'``).

    from strategyjob.client import StrategyJob, StrategyJobClient

    job = StrategyJob.build("mnist", strategy="MultiWorkerMirroredStrategy",
                            image="registry/mnist:1", command=["python", "train.py"], workers=4)
    with StrategyJobClient() as client:           # kubeconfig, else the pod's service account
        client.create(job)
        client.wait("mnist", timeout=3600)         # raises JobFailedError with the reason
        print(client.logs("mnist", replica="worker-0"))
        client.delete("mnist")

``StrategyJob`` is :class:`strategyjob.jobspec.StrategyJob`, the one model of the manifest
that ``strategyjob run`` and the operator read too.
"""

from strategyjob.client._client import StrategyJobClient
from strategyjob.client._errors import describe_api_error
from strategyjob.client._logs import LogLine
from strategyjob.client._view import STATES, Condition, ReplicaInfo, SubmittedJob
from strategyjob.errors import ClusterError, JobFailedError, JobNotFoundError
from strategyjob.jobspec import ManifestError, StrategyJob

__all__ = [
    "STATES",
    "ClusterError",
    "Condition",
    "JobFailedError",
    "JobNotFoundError",
    "LogLine",
    "ManifestError",
    "ReplicaInfo",
    "StrategyJob",
    "StrategyJobClient",
    "SubmittedJob",
    "describe_api_error",
]
