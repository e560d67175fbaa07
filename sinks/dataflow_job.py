"""A Dataflow job stopping itself: the cancel request a worker sends for the job it runs in.

A streaming job on Dataflow retries a failed work item for ever. A step every other step waits for (the
start-up seed) that can never succeed would hold the whole job, silently, for as long as it runs: such a step
cancels its job instead, after its own bounded retries. A worker knows its job by the ``JOB_ID`` environment
variable Dataflow sets (Beam's own ``sdk_worker_main`` reads it); project and region come from the launch.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

JOB_ID_VARIABLE = "JOB_ID"  # set by Dataflow in its workers' environment
CANCEL_TIMEOUT_SECONDS = 60.0

_LOGGER = logging.getLogger(__name__)


def _is_local(endpoint: str) -> bool:
    return "localhost" in endpoint or "127.0.0.1" in endpoint


@dataclasses.dataclass(frozen=True)
class DataflowJob:
    """Where the running job's Dataflow API is: ``endpoint`` is ``--dataflow_endpoint`` (a local one, e.g. a
    test server, is spoken to in REST with anonymous credentials)."""
    project: str
    region: str
    endpoint: Optional[str] = None

    @staticmethod
    def from_options(options: PipelineOptions) -> Optional[DataflowJob]:
        """The job's project, region and endpoint as launched; None without a project or region (not Dataflow)."""
        cloud = options.view_as(GoogleCloudOptions)
        if not cloud.project or not cloud.region:
            return None
        return DataflowJob(cloud.project, cloud.region, cloud.dataflow_endpoint)

    def _client(self):
        from google.api_core.client_options import ClientOptions
        from google.cloud import dataflow_v1beta3

        endpoint = (self.endpoint or "").strip().rstrip("/")
        if not endpoint:
            return dataflow_v1beta3.JobsV1Beta3Client()
        if _is_local(endpoint):
            from google.auth.credentials import AnonymousCredentials

            return dataflow_v1beta3.JobsV1Beta3Client(
                credentials=AnonymousCredentials(), transport="rest",
                client_options=ClientOptions(api_endpoint=endpoint))
        return dataflow_v1beta3.JobsV1Beta3Client(
            client_options=ClientOptions(api_endpoint=endpoint.split("://", 1)[-1]))

    def cancel(self, job_id: str, timeout_seconds: float = CANCEL_TIMEOUT_SECONDS) -> None:
        """Asks Dataflow to cancel job ``job_id``, within ``timeout_seconds``; raises what the API says."""
        from google.cloud import dataflow_v1beta3

        self._client().update_job(request=dataflow_v1beta3.UpdateJobRequest(
            project_id=self.project, location=self.region, job_id=job_id,
            job=dataflow_v1beta3.Job(requested_state=dataflow_v1beta3.JobState.JOB_STATE_CANCELLED)),
            timeout=timeout_seconds)


def cancel_this_job(job: Optional[DataflowJob], reason: str) -> Optional[str]:
    """Cancels the Dataflow job this worker runs in, logging ``reason`` as an error first; returns its id, or
    None when this is not a Dataflow worker (no ``JOB_ID``) or no job was given. A cancel that fails is logged:
    the caller fails its step either way."""
    job_id = os.environ.get(JOB_ID_VARIABLE)
    if job is None or not job_id:
        return None
    _LOGGER.error("%s: cancelling Dataflow job %s", reason, job_id)
    try:
        job.cancel(job_id)
    except Exception as error:  # noqa: BLE001 - logged; the step fails with the reason regardless
        _LOGGER.error("could not cancel Dataflow job %s: %s: %s", job_id, type(error).__name__, error)
    return job_id
