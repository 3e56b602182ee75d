"""A real S3-compatible server for the object-storage tests: moto's server mode
(`ThreadedMotoServer`) on a free loopback port, in the test process, with credentials that
it checks.

moto accepts any credentials until its IAM checks are switched on: the server made here
creates a user allowed s3:* and its access key, makes the bucket, then switches the checks on
(`/moto-api/reset-auth`), so a wrong secret key is refused as S3 refuses it. Its data lives in
the test process: a server stopped and started again on the same port finds its buckets.
"""

from __future__ import annotations

import json

import boto3
import httpx
from moto.server import ThreadedMotoServer

from support.servers import free_port

BUCKET = "models"
REGION = "us-east-1"


class S3Server:
    """moto's S3 on 127.0.0.1, a bucket BUCKET, and an IAM key (`env()` names them)."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server: ThreadedMotoServer | None = None
        self.start()
        admin = {
            "endpoint_url": self.endpoint,
            "region_name": REGION,
            "aws_access_key_id": "admin",
            "aws_secret_access_key": "admin",
        }
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="serving")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="serving", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="serving")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        boto3.client("s3", **admin).create_bucket(Bucket=BUCKET)
        # From here on every request must be signed with a key moto's IAM knows.
        httpx.post(f"{self.endpoint}/moto-api/reset-auth", content=b"0").raise_for_status()

    def start(self) -> None:
        """Listen (again) on the same port."""
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        """Stop listening (the data stays, for start())."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def env(self, secret_key: str | None = None) -> dict[str, str]:
        """The variables a client of this server reads (the secret key replaceable)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key or self.secret_key,
            "AWS_REGION": REGION,
            # No instance metadata to ask for credentials: there is none on loopback.
            "AWS_EC2_METADATA_DISABLED": "true",
        }
