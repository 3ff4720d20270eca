"""The coordinator's secrets (database password, admin token) and its own HTTPS.

Settings tests call the CLI's parser; process tests start ``python -m anex_agent
coordinator`` as users do and read its stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from anex_agent.wire.watch import WatchEvent
from anex_agent.client.rest import CoordinatorClient
from anex_agent.coordinator import cli
from anex_agent.coordinator.settings import Settings
from anex_agent.errors import ConfigError, CoordinatorError
from tests.coordinator.coordinator_process import CoordinatorProcess
from tests.tls_certs import make_certs

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "anexadm_h7_admin_token_0123456789"
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if not k.startswith(("ANEX_", "PG"))}


def settings(argv, env=None) -> Settings:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return cli.settings_from(parser.parse_args(argv), env or {})


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


# ---------------------------------------------------------------- settings


def test_database_password_from_environment_file_and_flag(tmp_path):
    url = ["--database", "postgresql://anex@db.example/anex"]
    assert settings(url, {"ANEX_DATABASE_PASSWORD": "pa/ss@w"}).database_password == "pa/ss@w"
    (tmp_path / "pw").write_text("pa/ss@w\n")
    assert settings(url, {"ANEX_DATABASE_PASSWORD_FILE": str(tmp_path / "pw")}).database_password == "pa/ss@w"
    assert settings([*url, "--database-password-file", str(tmp_path / "pw")]).database_password == "pa/ss@w"
    assert settings(url).database_password is None  # asyncpg then reads PGPASSWORD / PGPASSFILE itself
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError) as info:
        settings([*url, "--database-password-file", str(tmp_path / "empty")])
    assert info.value.source == "--database-password-file"


def test_a_password_in_the_url_is_moved_out_of_it_and_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        s = settings(["--database", "postgresql://anex:pa/ss@w@db.example:5432/anex"])
    assert s.database_url == "postgresql://anex@db.example:5432/anex" and s.database_password == "pa/ss@w"
    assert any("--database-password-file" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # from the environment: not on the command line, no warning
        s = settings([], {"ANEX_DATABASE_URL": "postgresql://anex:p%40ss@db.example/anex"})
    assert s.database_password == "p@ss" and not caplog.records
    with pytest.raises(ConfigError) as info:
        settings(["--database", "postgresql://anex:one@db/anex"], {"ANEX_DATABASE_PASSWORD": "two"})
    assert info.value.source == "--database"


def test_admin_token_from_its_file_twin(tmp_path):
    (tmp_path / "admin").write_text(ADMIN + "\n")
    assert settings([], {"ANEX_ADMIN_TOKEN_FILE": str(tmp_path / "admin")}).admin_token == ADMIN
    assert settings([], {"ANEX_ADMIN_TOKEN": ADMIN}).admin_token == ADMIN
    with pytest.raises(ConfigError) as info:
        settings([], {"ANEX_ADMIN_TOKEN_FILE": str(tmp_path / "missing")})
    assert info.value.source == "ANEX_ADMIN_TOKEN_FILE"


def test_repr_shows_no_secret(tmp_path, certs):
    s = settings(["--database", "postgresql://anex:db-s3cret@db.example/anex", "--tls-cert", str(certs.cert),
                  "--tls-key", str(certs.key)], {"ANEX_ADMIN_TOKEN": ADMIN})
    assert s.database_password == "db-s3cret" and s.admin_token == ADMIN
    text = repr(s) + str(s)
    assert "db-s3cret" not in text and ADMIN not in text
    assert "db.example" in text and "cert.pem" in text
    direct = Settings.for_tests(tmp_path, "postgresql://u:x/y@z@h/db", database_password=None)
    assert "x/y@z" not in repr(direct) and direct.database_password == "x/y@z"


def test_tls_flags_both_or_neither_and_files_checked(tmp_path, certs):
    s = settings(["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)])
    assert s.tls_cert == certs.cert and s.tls_key == certs.key
    cases = [
        (["--tls-cert", str(certs.cert)], "--tls-key"),
        (["--tls-key", str(certs.key)], "--tls-cert"),
        (["--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", str(certs.key)], "--tls-cert"),
        (["--tls-cert", str(certs.key), "--tls-key", str(certs.key)], "--tls-cert"),
        (["--tls-cert", str(certs.cert), "--tls-key", str(certs.cert)], "--tls-key"),
        (["--tls-cert", str(certs.cert), "--tls-key", str(certs.other_key)], "--tls-key"),
        (["--tls-cert", str(certs.cert), "--tls-key", str(certs.encrypted_key)], "--tls-key"),
    ]
    for argv, flag in cases:
        with pytest.raises(ConfigError) as info:
            settings(argv)
        assert info.value.source == flag, (argv, info.value)


def test_server_context_is_tls_1_2_or_newer(certs):
    import ssl

    from anex_agent.coordinator.tls import server_ssl_context

    assert server_ssl_context(certs.cert, certs.key).minimum_version >= ssl.TLSVersion.TLSv1_2


# ---------------------------------------------------------------- processes


def run_cli(args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "anex_agent", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**CLEAN_ENV, "PYTHONPATH": str(ROOT), **(env or {})})


def test_password_on_the_command_line_warns_and_never_shows(tmp_path):
    out = run_cli(["coordinator", "--state-dir", str(tmp_path), "--listen", "127.0.0.1:0",
                   "--database", "postgresql://anex:pw-S3CRET/x@y@127.0.0.1:1/anex"])
    assert out.returncode == 2, out.stderr
    assert "--database-password-file" in out.stderr and "visible to every user" in out.stderr
    assert "127.0.0.1:1" in out.stderr  # the connection error names the server...
    assert "S3CRET" not in out.stderr and "S3CRET" not in out.stdout  # ...but never the password


def test_tls_flag_errors_exit_2_naming_the_flag(tmp_path, certs):
    with ThreadPoolExecutor(max_workers=2) as pool:  # two independent processes, side by side
        without_key = pool.submit(run_cli, ["coordinator", "--state-dir", str(tmp_path), "--tls-cert", str(certs.cert)])
        other_key = pool.submit(run_cli, ["coordinator", "--state-dir", str(tmp_path), "--tls-cert", str(certs.cert),
                                          "--tls-key", str(certs.other_key)])
    out = without_key.result()
    assert out.returncode == 2 and "--tls-key" in out.stderr and "Traceback" not in out.stderr
    out = other_key.result()
    assert out.returncode == 2 and "--tls-key" in out.stderr and "does not match" in out.stderr


def Coordinator(args, env=None) -> CoordinatorProcess:
    return CoordinatorProcess(args, env={**CLEAN_ENV, **(env or {})})


async def test_serves_https_verified_with_the_ca_file(tmp_path, certs):
    (tmp_path / "admin").write_text(ADMIN + "\n")
    proc = Coordinator(["--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0",
                        "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)],
                       env={"ANEX_ADMIN_TOKEN_FILE": str(tmp_path / "admin")})
    try:
        url = proc.wait_listening()
        assert url.startswith("https://127.0.0.1:")
        async with CoordinatorClient(url, admin_token=ADMIN, ca_file=certs.ca) as client:
            assert (await client.list_nodes()).nodes == []  # verified, and the admin token came from the file
            client.set_credential("anexnode_not_a_real_credential")
            with pytest.raises(CoordinatorError) as info:  # the watch WebSocket gets through TLS to the 401
                async for _ in client._watch_once("/v1/watch?since=0", WatchEvent, "credential", []):
                    pass
            assert info.value.status == 401
        async with CoordinatorClient(url, admin_token=ADMIN) as client:  # system CAs only: refused
            with pytest.raises(CoordinatorError) as info:
                await client.list_nodes()
            assert "certificate" in str(info.value).lower() and info.value.status is None
            client.set_credential("anexnode_not_a_real_credential")
            with pytest.raises(CoordinatorError) as info:
                async for _ in client._watch_once("/v1/watch?since=0", WatchEvent, "credential", []):
                    pass
            assert "certificate" in str(info.value).lower() and info.value.status is None
        http_url = url.replace("https://", "http://")
        async with CoordinatorClient(http_url, admin_token=ADMIN) as client:  # no plain HTTP on that port
            with pytest.raises(CoordinatorError):
                await client.list_nodes()
    finally:
        stderr = proc.stop()
    assert ADMIN not in stderr


# ---------------------------------------------------------------- PostgreSQL with password authentication

PG_PASSWORD = "pa/ss@w:rd?#x%"  # '/', '@', ':', '?', '#' and '%' in one


def _psql(sql: str) -> subprocess.CompletedProcess:
    return subprocess.run(["su", "postgres", "-c", f"psql -v ON_ERROR_STOP=1 -q -c \"{sql}\""],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def pg_role():
    """A role with a password full of URL delimiters, and a database it owns (needs local superuser access)."""
    if not os.environ.get("ANEX_TEST_POSTGRES_URL"):
        pytest.skip("ANEX_TEST_POSTGRES_URL is not set (needs PostgreSQL)")
    if os.geteuid() != 0:
        pytest.skip("creating a PostgreSQL role needs root (su postgres)")
    name = f"anex_pw_{os.getpid()}_{int(time.time() * 1000) % 100000}"
    escaped = PG_PASSWORD.replace("'", "''")
    made = _psql(f"CREATE ROLE {name} LOGIN PASSWORD '{escaped}'")
    if made.returncode != 0:
        pytest.skip(f"cannot create a PostgreSQL role here: {made.stderr.strip()}")
    _psql(f"CREATE DATABASE {name} OWNER {name}")
    try:
        yield name
    finally:
        _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        _psql(f"DROP ROLE IF EXISTS {name}")


def test_postgres_password_from_a_file_reaches_the_connection(tmp_path, pg_role):
    url = f"postgresql://{pg_role}@127.0.0.1:5432/{pg_role}"
    (tmp_path / "wrong").write_text("not-the-password\n")
    out = run_cli(["coordinator", "--state-dir", str(tmp_path / "s0"), "--listen", "127.0.0.1:0",
                   "--database", url, "--database-password-file", str(tmp_path / "wrong")],
                  env={"ANEX_ADMIN_TOKEN": ADMIN})
    assert out.returncode == 2 and "password authentication failed" in out.stderr  # the server checks passwords
    (tmp_path / "pw").write_text(PG_PASSWORD + "\n")
    for extra_args, env in (
        (["--database-password-file", str(tmp_path / "pw")], {}),
        ([], {"ANEX_DATABASE_PASSWORD_FILE": str(tmp_path / "pw")}),
        ([], {"ANEX_DATABASE_PASSWORD": PG_PASSWORD}),
    ):
        proc = Coordinator(["--state-dir", str(tmp_path / "s1"), "--listen", "127.0.0.1:0", "--database", url,
                            *extra_args], env={"ANEX_ADMIN_TOKEN": ADMIN, **env})
        try:
            assert proc.wait_listening().startswith("http://127.0.0.1:")
        finally:
            stderr = proc.stop()
        assert "(postgresql)" in stderr and PG_PASSWORD not in stderr


@pytest.mark.parametrize("form", ["percent-encoded", "raw"])
async def test_postgres_password_in_the_url(pg_role, form):
    """In a URL a password is percent-encoded (RFC 3986); one written raw with '/' or '@' works too,
    as long as it holds no '%' followed by two hex digits."""
    from urllib.parse import quote

    from anex_agent.coordinator.db import open_database

    written = quote(PG_PASSWORD, safe="") if form == "percent-encoded" else PG_PASSWORD
    db = await open_database(f"postgresql://{pg_role}:{written}@127.0.0.1:5432/{pg_role}")
    try:
        assert await db.fetchval("SELECT current_user") == pg_role
        assert written not in db.url and PG_PASSWORD not in db.url
    finally:
        await db.close()


# ---------------------------------------------------------------- plain HTTP past this host


@pytest.mark.parametrize("host, warned", [("0.0.0.0", True), ("::", True), ("192.0.2.10", True),
                                          ("127.0.0.1", False), ("127.0.0.5", False), ("::1", False)])
def test_plain_http_on_an_address_others_reach_is_warned_about(host, warned):
    text = cli.plain_http_warning(host, 8700, tls=False)
    assert (text is not None) is warned
    if warned:
        assert "clear text" in text and "--tls-cert FILE and --tls-key FILE" in text and "8700" in text
    assert cli.plain_http_warning(host, 8700, tls=True) is None


def test_the_coordinator_on_every_address_without_tls_starts_with_the_warning(tmp_path, certs):
    # two independent coordinators (own state directories, own ports), started side by side
    plain = Coordinator(["--state-dir", str(tmp_path / "plain"), "--listen", "0.0.0.0:0"])
    tls = Coordinator(["--state-dir", str(tmp_path / "tls"), "--listen", "0.0.0.0:0",
                       "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)])
    try:
        try:
            assert plain.wait_listening().startswith("http://0.0.0.0:")
        finally:
            err = plain.stop()
        assert "--listen 0.0.0.0:0 without --tls-cert" in err and "cross the network in clear text" in err
        assert tls.wait_listening().startswith("https://0.0.0.0:")
    finally:
        err = tls.stop()
    assert "clear text" not in err
