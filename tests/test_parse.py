"""anex_agent.parse: ASCII digits only, bounded, one error text saying what is accepted."""

from __future__ import annotations

import ipaddress

import pytest

from anex_agent import parse

WEIRD_DIGITS = ["²", "①", "٣", "３", "߃", "1" * 5000, "-1", "+1", " 1", "1 ", "1_000", "0x10", "", "1.0", "1e3"]


@pytest.mark.parametrize("text", WEIRD_DIGITS)
def test_integer_refuses_everything_but_ascii_digits(text):
    with pytest.raises(ValueError, match="ASCII digits"):
        parse.integer(text)


def test_integer_bounds_and_value():
    assert parse.integer("0") == 0
    assert parse.integer("007") == 7
    assert parse.integer("9223372036854775807") == 2**63 - 1
    with pytest.raises(ValueError, match="from 1 to 10"):
        parse.integer("11", minimum=1, maximum=10)
    with pytest.raises(ValueError, match="from 1 to 10"):
        parse.integer("0", minimum=1, maximum=10)
    with pytest.raises(ValueError, match="at least 5"):
        parse.integer("4", minimum=5)


@pytest.mark.parametrize("text", ["0", "65536", "٣", "３", "²", "80 ", "-80", "1" * 100])
def test_port_refuses(text):
    with pytest.raises(ValueError, match="port from 1 to 65535"):
        parse.port(text)


@pytest.mark.parametrize("text, expected", [("53", (53, "tcp")), ("53/tcp", (53, "tcp")), ("53/udp", (53, "udp")),
                                            ("65535/UDP", (65535, "udp")), ("1/Tcp", (1, "tcp"))])
def test_port_protocol_accepts(text, expected):
    assert parse.port_protocol(text) == expected


@pytest.mark.parametrize("text", ["", "/udp", "53/", "53/sctp", "0/udp", "65536/tcp", "53/udp/", "５３/udp", "53/ｕｄｐ",
                                  " 53/udp", "53 /udp", "1" * 40 + "/udp", None])
def test_port_protocol_refuses(text):
    with pytest.raises(ValueError, match="must be PORT, PORT/tcp or PORT/udp with a port from 1 to 65535"):
        parse.port_protocol(text)


def test_port_accepts():
    assert parse.port("1") == 1 and parse.port("65535") == 65535


@pytest.mark.parametrize("text, expected", [
    ("gw.example.com:51820", ("gw.example.com", 51820)),
    ("203.0.113.9:80", ("203.0.113.9", 80)),
    ("[2001:db8::1]:443", ("2001:db8::1", 443)),
    ("[fe80::1%eth0]:443", ("fe80::1%eth0", 443)),
    ("my_svc.default.svc.cluster.local:8080", ("my_svc.default.svc.cluster.local", 8080)),
    ("a:1", ("a", 1)),
])
def test_host_port_accepts(text, expected):
    assert parse.host_port(text) == expected


@pytest.mark.parametrize("text", [
    "nonsense", "203.0.113.9", "203.0.113.9:0", "203.0.113.9:70000", ":80", "2001:db8::1:443",
    "[203.0.113.9]:80", "[nothex]:80", "host:٣", "host:３", "host:²", "ho st:80", "hóst:80", "a\x00b:80",
    "host:80\x00", "-bad-.example:80", "x" * 300 + ":80", "[::1]:",
])
def test_host_port_refuses(text):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse.host_port(text)


def test_cidr():
    assert parse.cidr("10.96.1.2/12") == ipaddress.ip_network("10.96.0.0/12")
    assert str(parse.cidr("fd00::/8")) == "fd00::/8"
    for bad in ("10.0.0.0/٣", "10.0.0.0/３", "10.0.0.0/+8", "10.0.0.0/33", "nope", "10.0.0.0/8" + "0" * 60):
        with pytest.raises(ValueError, match="CIDR"):
            parse.cidr(bad)
    with pytest.raises(ValueError, match="host bits"):
        parse.cidr("10.96.1.2/12", strict=True)


def test_cidr_text_is_cidr_as_canonical_text_on_its_fast_path_too():
    samples = ["10.254.0.7/32", "10.96.1.2/12", "10.96.0.0/12", "0.0.0.0/0", "255.255.255.255/32", "1.2.3.4/0",
               "10.0.0.0/8", "010.0.0.0/8", "10.0.0.256/32", "10.0.0.0/33", "10.0.0.0/08", "10.0.0.0/٣",
               "1.2.3/24", "fd00::/8", "fd00::1/128", "10.0.0.0", "nope", " 10.0.0.0/8", "10.0.0.0/8\n"]
    for text in samples:
        try:
            want = str(parse.cidr(text))
        except ValueError:
            with pytest.raises(ValueError, match="CIDR"):
                parse.cidr_text(text)
        else:
            assert parse.cidr_text(text) == want, text


def test_messages_do_not_echo_the_input():
    """The caller names the input; the text says what is accepted, the same for every input."""
    for fn, a, b in ((parse.integer, "²", "x"), (parse.port, "0", "99999"), (parse.host_port, "a", "b:0")):
        with pytest.raises(ValueError) as one:
            fn(a)
        with pytest.raises(ValueError) as two:
            fn(b)
        assert str(one.value) == str(two.value)


@pytest.mark.parametrize("text, options, expected", [
    ("127.0.0.1:3128", {}, ("127.0.0.1", 3128)),
    ("[::1]:3128", {}, ("::1", 3128)),
    ("0.0.0.0:1", {}, ("0.0.0.0", 1)),
    ("localhost:3129", {}, ("127.0.0.1", 3129)),
    (":8080", {"empty_host": "127.0.0.1"}, ("127.0.0.1", 8080)),
    (":51820", {"empty_host": ""}, ("", 51820)),
    ("127.0.0.1:0", {"any_port": True}, ("127.0.0.1", 0)),
    ("[fe80::1%eth0]:80", {}, ("fe80::1%eth0", 80)),
])
def test_listen_accepts(text, options, expected):
    assert parse.listen(text, **options) == expected


@pytest.mark.parametrize("text", [
    "3128", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:²", "127.0.0.1:①", "127.0.0.1:٣", "127.0.0.1:３",
    ":8080", "::1:3128", "[127.0.0.1]:3128", "[::1]3128", "host.example:3128", "LOCALHOST:80", " 127.0.0.1:80",
    "127.0.0.1:80 ", "", "1" * 300 + ":80", "[::1]:",
])
def test_listen_refuses(text):
    with pytest.raises(ValueError, match="must be HOST:PORT with HOST an IP address or localhost"):
        parse.listen(text)


def test_listen_port_zero_only_when_asked_and_said_so():
    with pytest.raises(ValueError, match="port from 1 to 65535") as info:
        parse.listen("127.0.0.1:0")
    assert "any free port" not in str(info.value)
    with pytest.raises(ValueError, match=r"port from 0 to 65535 in ASCII digits \(0: any free port\)"):
        parse.listen("127.0.0.1:٠", any_port=True)  # an Arabic-Indic zero is not 0
    with pytest.raises(ValueError, match="no HOST: every address"):
        parse.listen("::1:80", empty_host="")


@pytest.mark.parametrize("text, expected", [
    ("10.96.0.10", ("10.96.0.10", 53)), ("10.96.0.10:5353", ("10.96.0.10", 5353)), ("fd00::a", ("fd00::a", 53)),
    ("[fd00::a]:54", ("fd00::a", 54)),
])
def test_ip_port_with_a_default(text, expected):
    assert parse.ip_port(text, default_port=53) == expected


@pytest.mark.parametrize("text", [
    "10.96.0.10:0", "10.96.0.10:65536", "10.96.0.10:²", "10.96.0.10:①", "10.96.0.10:٣", "10.96.0.10:３", ":53",
    "kube-dns", "kube-dns:53", "[10.96.0.10]:53", "[fd00::a]", "[fd00::a]x", "[fd00::a", "10.96.0.10:", "",
    "١٠.96.0.10", "x" * 300,
])
def test_ip_port_refuses(text):
    with pytest.raises(ValueError, match="must be an IP address"):
        parse.ip_port(text, default_port=53)


def test_ip_port_without_a_default_needs_the_port():
    assert parse.ip_port("[fd00::1]:51820") == ("fd00::1", 51820)
    for text in ("10.0.0.1", "fd00::1", "fd00::1:51820", "gw.example.com:51820"):
        with pytest.raises(ValueError, match="IPv6 in brackets"):
            parse.ip_port(text)


def test_arg_type_keeps_the_text_and_names_the_option_through_argparse(capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--listen", type=parse.arg_type(parse.listen))
    assert parser.parse_args(["--listen", "[::1]:80"]).listen == "[::1]:80"
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--listen", "127.0.0.1:３"])
    assert info.value.code == 2
    assert "argument --listen: '127.0.0.1:３' must be HOST:PORT" in capsys.readouterr().err


def test_module_is_pure():
    """Cores (the proxy's request handling, the WireGuard core) use it: no I/O, nothing of anex-agent."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(parse))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "ipaddress", "re", "collections", "argparse"}, imported


def test_listen_and_ip_port_messages_do_not_echo_the_input():
    for fn, a, b in ((parse.listen, "²", "x:0"), (parse.ip_port, "a", "b:0")):
        with pytest.raises(ValueError) as one:
            fn(a)
        with pytest.raises(ValueError) as two:
            fn(b)
        assert str(one.value) == str(two.value)


# Files whose isdigit() reads something other than an address, a port or a network (a
# database's row-count tag, a uid or PID, /proc entries, offer fields); everything else parses through
# this module.
ISDIGIT_ELSEWHERE = {
    "coordinator/db.py", "agent/workload.py", "tunnels/engines/cleanup.py", "testing/netlab.py", "host/statelock.py",
    "agent/container_state.py", "agent/reaper.py", "host/sdnotify.py",
    "providers/offers_http.py", "selection/units.py", "selection/annotations.py", "selection/versions.py",
}


def test_no_module_splits_host_port_or_reads_ports_by_hand():
    import re
    from pathlib import Path

    package = Path(parse.__file__).parent
    split, digits = [], []
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        if name == "parse.py":
            continue
        text = path.read_text()
        if re.search(r"""rpartition\(["']:["']\)|rsplit\(["']:["']""", text):  # USER:PASSWORD splits on the left
            split.append(name)
        if ".isdigit()" in text and name not in ISDIGIT_ELSEWHERE:
            digits.append(name)
    assert split == [] and digits == [], (split, digits)


def test_is_integer_accepts_ascii_digits_only():
    assert parse.is_integer("0") and parse.is_integer("123456")
    for text in ("", "-1", "+1", " 1", "1_000", "²", "١٢", "1.0", None, 12):
        assert not parse.is_integer(text), text


@pytest.mark.parametrize("text", ["", "nan", "inf", "-1", "1e3", "1,5", "٣", "３", " 1", "1.", "0x10", "1_000"])
def test_number_refuses_everything_but_ascii_decimals(text):
    with pytest.raises(ValueError, match="must be a number of at least 0"):
        parse.number(text, minimum=0)


def test_number_bounds_and_integers():
    assert parse.number("0.25", minimum=0.1) == 0.25 and parse.number(".5", minimum=0) == 0.5
    assert parse.number("12", minimum=1, integer=True) == 12 and isinstance(parse.number("12", minimum=1, integer=True), int)
    with pytest.raises(ValueError, match="an integer of at least 1"):
        parse.number("1.5", minimum=1, integer=True)
    with pytest.raises(ValueError, match="at least 0.05"):
        parse.number("0.01", minimum=0.05)


def test_env_number_names_the_variable_and_keeps_the_default():
    from anex_agent.errors import ConfigError, env_number

    assert env_number({}, "ANEX_X", 5.0, minimum=1) == 5.0 and env_number({"ANEX_X": ""}, "ANEX_X", 5.0, minimum=1) == 5.0
    assert env_number({"ANEX_X": "7"}, "ANEX_X", 5.0, minimum=1) == 7.0
    with pytest.raises(ConfigError) as info:
        env_number({"ANEX_X": "soon"}, "ANEX_X", 5.0, minimum=1)
    assert info.value.source == "ANEX_X" and "'soon' must be a number of at least 1" in str(info.value)


# ---------------------------------------------------------------- booleans: one reader everywhere


@pytest.mark.parametrize("text, value", [("1", True), ("true", True), ("TRUE", True), ("Yes", True), (" on ", True),
                                         ("0", False), ("false", False), ("No", False), ("OFF", False)])
def test_boolean_accepts_one_documented_set_in_any_case(text, value):
    assert parse.boolean(text) is value


@pytest.mark.parametrize("text", ["", " ", "2", "y", "n", "enable", "１", "yes please", "t" * 100])
def test_boolean_refuses_the_rest_saying_what_is_accepted(text):
    with pytest.raises(ValueError, match="must be one of 1/0, true/false, yes/no or on/off"):
        parse.boolean(text)


def _boolean_readers():
    """Every reader of a boolean variable: (variable, read(environ) -> bool)."""
    from anex_agent.client import transport
    from anex_agent.telemetry import options as telemetry_options
    from anex_agent.agent import run_options

    def run(name):
        import argparse

        from anex_agent.agent import cli_run
        parser = argparse.ArgumentParser()
        cli_run.configure(parser)
        args = parser.parse_args(["--", "true"])
        return lambda env: getattr(run_options.from_args(args, env), name)
    return [
        ("ANEX_ALLOW_INSECURE", transport.allow_insecure_from),
        ("ANEX_LOGS", run("capture_logs")),
        ("ANEX_PROXY_ENV", run("proxy_env")),
        ("ANEX_METRICS_PCIE_THROUGHPUT", lambda env: telemetry_options.exposition_options(env).pcie_throughput),
    ]


@pytest.mark.parametrize("variable, read", _boolean_readers(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_boolean_variable_reads_the_same_words(variable, read):
    from anex_agent.errors import ConfigError

    for text, value in (("yes", True), ("true", True), ("1", True), ("On", True),
                        ("no", False), ("false", False), ("0", False), ("OFF", False)):
        assert read({variable: text}) is value, (variable, text)
    with pytest.raises(ConfigError) as info:
        read({variable: "maybe"})
    assert info.value.source == variable and "yes/no" in str(info.value)


# ---------------------------------------------------------------- durations


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("15m", 900), ("12h", 43200), ("7d", 604800)])
def test_duration_accepts_seconds_and_units(text, seconds):
    assert parse.duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "1.5h", "-5m", "5 m", "5w", "h", "５m", "1h30m", "9" * 40])
def test_duration_refuses(text):
    with pytest.raises(ValueError, match="90s, 15m, 12h or 7d"):
        parse.duration(text)


def test_duration_bounds():
    assert parse.duration("365d", maximum=365 * 86400) == 365 * 86400
    with pytest.raises(ValueError, match="to 31536000 s"):
        parse.duration("366d", maximum=365 * 86400)
