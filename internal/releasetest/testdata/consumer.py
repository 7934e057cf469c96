"""An agent's program that installed the retryd wheel from the release:
prints retryd.__version__, then reports one failed model request to the
retryd at sys.argv[1]."""

import sys

import retryd
from retryd.v1 import events_pb2, retry_service_pb2

print(retryd.__version__)
with retryd.Client(sys.argv[1], credentials=retryd.insecure()) as client:
    resp = client.failed_step(
        retry_service_pb2.FailedStepRequest(
            session_id="release-python",
            turn=1,
            step=1,
            provider="deepseek",
            failure=events_pb2.Failure(code="RATE_LIMIT", http_status=429),
        )
    )
    if resp.decision.WhichOneof("outcome") != "schedule":
        sys.exit(f"FailedStep answered {resp.decision}, want a scheduled retry")
    s = resp.decision.schedule
    print(f"scheduled retry {s.retry_number} of {s.max_retries}")
