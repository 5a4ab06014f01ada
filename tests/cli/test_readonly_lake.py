"""Read-only commands (`runs list`, `runs show`, `query`, `resume`'s lookup) never create a
lake: a missing folder or bucket is exit 2 with a hint naming the lake, and stays missing.
Runs the real command; S3 on a moto server on loopback, checked afterwards with boto3."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from tests.cli.cli_process import error_lines, run_rlpipe
from tests.helpers.s3_server import unique_bucket

READ_ONLY = {
    "runs list": ["runs", "list"],
    "runs show": ["runs", "show", "some-run"],
    "query": ["query", "select count(*) from trajectories"],
    "resume": ["resume", "some-run"],
}
S3_KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


@pytest.mark.parametrize("command", sorted(READ_ONLY))
def test_a_missing_local_lake_is_exit_2_and_is_not_created(long_tmp: Path, command: str) -> None:
    lake = long_tmp / "typo-lake"
    result = run_rlpipe([*READ_ONLY[command], "--lake", str(lake)], long_tmp)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    error, hint = error_lines(result)
    assert f"no lake at {lake}" in error  # the whole path on one line, at 40 columns
    assert "--lake" in hint and "--config" in hint
    assert not lake.exists()


def buckets(endpoint: str) -> set[str]:
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    return {bucket["Name"] for bucket in client.list_buckets()["Buckets"]}


@pytest.mark.parametrize("command", ["runs list", "resume"])  # one listing, one lookup: the same opening code
def test_a_missing_bucket_is_exit_2_and_is_not_created(tmp_path: Path, s3_endpoint: str, command: str) -> None:
    result = run_rlpipe([*READ_ONLY[command], "--lake", "s3://nobucket/x"], tmp_path, AWS_ENDPOINT_URL=s3_endpoint, **S3_KEYS)
    assert result.returncode == 2, result.stderr
    error, hint = error_lines(result)
    assert "no lake at s3://nobucket/x" in error and "'nobucket' does not exist" in error
    assert "--lake" in hint
    assert "nobucket" not in buckets(s3_endpoint)


def test_an_empty_prefix_of_an_existing_bucket_is_no_lake(tmp_path: Path, s3_endpoint: str) -> None:
    bucket = unique_bucket("holds-other-things")
    boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    result = run_rlpipe(["runs", "list", "--lake", f"s3://{bucket}/lkae"], tmp_path,
                        AWS_ENDPOINT_URL=s3_endpoint, **S3_KEYS)
    assert result.returncode == 2, result.stderr
    error, _ = error_lines(result)
    assert f"no lake at s3://{bucket}/lkae" in error and "nothing is stored under 'lkae'" in error


def test_an_existing_empty_local_lake_lists_no_runs(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    result = run_rlpipe(["runs", "list", "--lake", str(lake), "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_an_existing_s3_lake_opens_read_only(tmp_path: Path, s3_endpoint: str) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    bucket = unique_bucket("has-a-lake")
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="lake/runs/r1/status.json", Body=b"{}")  # a run folder without run.json
    result = run_rlpipe(["runs", "list", "--lake", f"s3://{bucket}/lake", "--json"], tmp_path,
                        AWS_ENDPOINT_URL=s3_endpoint, **S3_KEYS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"  # r1 has no run.json: not a run
