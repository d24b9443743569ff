"""A real LDAP server for the LDAP log-in tests: Debian's slapd in a process of its own, on a
free loopback port, with its own configuration and database in a temporary folder (never the
system's slapd), seeded from an LDIF: people, a service account, and groupOfNames groups."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.livesite import STARTED, free_port, stop_process

SLAPD = "/usr/sbin/slapd"
SLAPADD = "/usr/sbin/slapadd"
LDAPMODIFY = "/usr/bin/ldapmodify"
SCHEMAS = Path("/etc/ldap/schema")
MODULES = Path("/usr/lib/ldap")

SUFFIX = "dc=example,dc=com"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PASSWORD = "root-secret"
# The account chatsite searches with (CHAT_LDAP_BIND_DN): anonymous users may read nothing.
SERVICE_DN = f"cn=chatsite,ou=services,{SUFFIX}"
SERVICE_PASSWORD = "service-secret"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
ADMINS_GROUP = f"cn=chat-admins,{GROUPS}"
INTERNS_GROUP = f"cn=interns,{GROUPS}"
# uid: (password, given name, surname, the groups they are in)
USERS = {
    "ada": ("ada-directory-password", "Ada", "Lovelace", [ADMINS_GROUP, INTERNS_GROUP]),
    "bob": ("bob-directory-password", "Bob", "Builder", [INTERNS_GROUP]),
    # A groupOfNames has a member at least: the tests take ada and bob out of groups.
    "cy": ("cy-directory-password", "Cy", "Twombly", [ADMINS_GROUP, INTERNS_GROUP]),
}


def person_dn(uid: str) -> str:
    return f"uid={uid},{PEOPLE}"


def base_entries() -> list[str]:
    """The directory's root, the service account, and the people and groups units, empty."""
    return [
        f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: Example",
        f"dn: ou=services,{SUFFIX}\nobjectClass: organizationalUnit\nou: services",
        f"dn: {SERVICE_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\ncn: chatsite\n"
        f"userPassword: {SERVICE_PASSWORD}",
        f"dn: {PEOPLE}\nobjectClass: organizationalUnit\nou: people",
        f"dn: {GROUPS}\nobjectClass: organizationalUnit\nou: groups",
    ]


def seed_ldif() -> str:
    entries = base_entries()
    for uid, (password, given, surname, _) in USERS.items():
        entries.append(
            f"dn: {person_dn(uid)}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {given} {surname}\n"
            f"givenName: {given}\nsn: {surname}\nmail: {uid}@example.com\nuserPassword: {password}"
        )
    for group in (ADMINS_GROUP, INTERNS_GROUP):
        members = [person_dn(uid) for uid, (*_, groups) in USERS.items() if group in groups]
        lines = [f"dn: {group}", "objectClass: groupOfNames", f"cn: {group.split(',')[0][3:]}"]
        entries.append("\n".join(lines + [f"member: {member}" for member in members]))
    return "\n\n".join(entries) + "\n"


# nis: posixAccount and posixGroup (RFC 2307). The tests that play Active Directory add a
# schema of their own (tests/ldap_login/ad.schema): a path, without ".schema", works as a name.
SCHEMA_NAMES = ("core", "cosine", "nis", "inetorgperson")


def slapd_conf(folder: Path, schemas: tuple[str, ...] = SCHEMA_NAMES) -> str:
    includes = "".join(f"include {SCHEMAS / name}.schema\n" for name in schemas)
    return f"""{includes}
modulepath {MODULES}
moduleload back_mdb
pidfile {folder}/slapd.pid
argsfile {folder}/slapd.args

database mdb
maxsize 16777216
suffix "{SUFFIX}"
rootdn "{ROOT_DN}"
rootpw {ROOT_PASSWORD}
directory {folder}/data
access to attrs=userPassword by self write by anonymous auth by * none
access to * by users read by * none
"""


@dataclass(frozen=True)
class Directory:
    uri: str

    def modify(self, ldif: str, *, fine: tuple[int, ...] = (0,)) -> None:
        """ldapmodify as the directory's root, as an administrator of the directory would;
        an exit status outside `fine` fails."""
        done = subprocess.run(
            [LDAPMODIFY, "-x", "-H", self.uri, "-D", ROOT_DN, "-w", ROOT_PASSWORD],
            input=ldif,
            text=True,
            capture_output=True,
            timeout=30,
        )
        if done.returncode not in fine:
            raise RuntimeError(f"ldapmodify exited with {done.returncode}: {done.stderr}")

    def remove_member(self, group: str, uid: str) -> None:
        self.modify(f"dn: {group}\nchangetype: modify\ndelete: member\nmember: {person_dn(uid)}\n")

    def add_member(self, group: str, uid: str) -> None:
        """Make `uid` a member of `group`, whether or not they are one already."""
        # 20: LDAP's "type or value exists", a member already.
        self.modify(f"dn: {group}\nchangetype: modify\nadd: member\nmember: {person_dn(uid)}\n", fine=(0, 20))


def require_slapd() -> None:
    """Skip without Debian's slapd and ldap-utils, unless CHATSITE_REQUIRE_LDAP=1 (CI) says they must be there."""
    missing = [path for path in (SLAPD, SLAPADD, LDAPMODIFY) if not os.access(path, os.X_OK)]
    if not missing:
        return
    message = f"{', '.join(missing)} missing: apt-get install -y slapd ldap-utils to run the LDAP tests"
    if os.environ.get("CHATSITE_REQUIRE_LDAP") == "1":
        pytest.fail(message)
    pytest.skip(message)


@contextmanager
def ldap_server(
    timeout_s: float = 30, *, schemas: tuple[str, ...] = SCHEMA_NAMES, ldif: str | None = None
) -> Iterator[Directory]:
    """`with ldap_server() as directory:` slapd seeded with `ldif` (seed_ldif()'s unless
    given), knowing the `schemas` of /etc/ldap/schema, stopped after."""
    require_slapd()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="slapd-") as name:
        folder = Path(name)
        (folder / "data").mkdir()
        conf = folder / "slapd.conf"
        conf.write_text(slapd_conf(folder, schemas))
        (folder / "seed.ldif").write_text(seed_ldif() if ldif is None else ldif)
        # Seeded offline, before the server starts: quicker than adding over the network.
        subprocess.run([SLAPADD, "-q", "-f", str(conf), "-l", str(folder / "seed.ldif")], check=True, timeout=60)
        uri = f"ldap://127.0.0.1:{port}"
        log = folder / "slapd.log"
        STARTED["slapd"] += 1
        with log.open("wb") as output:
            # -d 0: in the foreground (no daemon to find afterwards), logging nothing but errors.
            process = subprocess.Popen(
                [SLAPD, "-d", "0", "-f", str(conf), "-h", f"{uri}/"], stdout=output, stderr=output
            )
            try:
                _wait_ready(port, process, log, timeout_s)
                yield Directory(uri=uri)
            finally:
                stop_process(process)


def _wait_ready(port: int, process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"slapd exited with {process.returncode}:\n{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"slapd not listening after {timeout_s} s:\n{log.read_text()}")
