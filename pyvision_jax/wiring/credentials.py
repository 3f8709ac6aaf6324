"""Secrets a run needs (the queue's password, the judge's API key) come from an environment
variable or a file that the config names, never from a config value: the config is written
to WORKDIR/config.json and shown in logs, so it may carry where a secret is, not the secret.
A queue URL with a password in it is refused for the same reason."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import ml_collections


def read_secret(env_key: str, env_name: str, file_key: str, file_path: str) -> str | None:
    """The secret in environment variable `env_name` or in file `file_path` (its first line);
    None when neither is set. Errors name the config key and the variable or file, never the
    value."""
    if env_name and file_path:
        raise ValueError(f"--config.{env_key} and --config.{file_key} are both set: set one of them")
    if env_name:
        value = os.environ.get(env_name, "")
        if not value:
            raise ValueError(f"--config.{env_key}={env_name!r}: the environment variable {env_name} is not set")
        return value
    if file_path:
        try:
            with open(file_path, encoding="utf-8") as file:
                value = file.readline().rstrip("\r\n")
        except (OSError, UnicodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else type(error).__name__
            raise ValueError(f"--config.{file_key}={file_path!r}: cannot read it ({reason})") from None
        if not value:
            raise ValueError(f"--config.{file_key}={file_path!r}: the file's first line is empty")
        return value
    return None


def queue_password(config: ml_collections.ConfigDict) -> str | None:
    """The Redis password of `rollout.redis_password_env` / `rollout.redis_password_file`;
    `rollout.redis_url` itself may name the user (redis://USER@HOST:PORT/DB) but not a password."""
    r = config.rollout
    password = urlsplit(r.redis_url).password
    if password is not None:
        shown = r.redis_url.replace(f":{password}@", ":***@", 1)
        raise ValueError(
            f"--config.rollout.redis_url={shown} carries a password: give the URL without it and the password in "
            f"--config.rollout.redis_password_env or --config.rollout.redis_password_file"
        )
    return read_secret(
        "rollout.redis_password_env", r.redis_password_env, "rollout.redis_password_file", r.redis_password_file
    )


def judge_api_key(config: ml_collections.ConfigDict) -> str | None:
    """The judge's API key of `grading.judge_api_key_env` / `grading.judge_api_key_file`."""
    g = config.grading
    return read_secret(
        "grading.judge_api_key_env", g.judge_api_key_env, "grading.judge_api_key_file", g.judge_api_key_file
    )
