"""Certificates and kubeconfigs for the loopback control plane, made with the openssl CLI.

One CA signs the apiserver's serving certificate and a client certificate per identity; the
ServiceAccount token key pair is separate. ECDSA P-256 keys: fast to generate, accepted by
every component.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from chexflow.errors import ChexflowError

# Client identities: file stem -> (common name, organisation). Controller-manager and scheduler
# get the bootstrap RBAC identities; kwok and mpi-operator run as cluster admins (as their
# upstream deployments' ClusterRoles allow what they need on every resource they touch).
CLIENTS = {
    "admin": ("chexflow-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", ""),
    "scheduler": ("system:kube-scheduler", ""),
    # the real node's kubelet, as the Node authorizer expects (realnode.NODE_NAME)
    "kubelet": ("system:node:chexflow-node", "system:nodes"),
    # the real node's kube-proxy (bootstrap ClusterRoleBinding system:node-proxier)
    "kube-proxy": ("system:kube-proxy", ""),
}
SERVICE_IP = "198.19.0.1"  # first address of --service-cluster-ip-range


class CertificateError(ChexflowError):
    """openssl failed while making the control plane's certificates."""


@dataclass(frozen=True)
class PKI:
    """Paths of everything certs.make_pki writes under <dir>/pki."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def client(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.crt", self.dir / f"{name}.key"


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise CertificateError("openssl not found: install it with images/install-system.sh")
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CertificateError(f"openssl {' '.join(args)}: {proc.stderr.strip()}")


def _ec_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(path), cwd=path.parent)
    path.chmod(0o600)


def _signed_cert(pki: PKI, stem: str, subject: str, extensions: str) -> None:
    """<stem>.key and <stem>.crt signed by the CA, valid one year, with the given v3 extensions."""
    key, crt, csr, ext = (pki.dir / f"{stem}.{s}" for s in ("key", "crt", "csr", "ext"))
    _ec_key(key)
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr), cwd=pki.dir)
    ext.write_text(extensions)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(pki.ca), "-CAkey", str(pki.ca_key),
             "-CAcreateserial", "-days", "365", "-sha256", "-extfile", str(ext),
             "-out", str(crt), cwd=pki.dir)
    csr.unlink()
    ext.unlink()


def make_pki(state_dir: Path, server_ips: tuple[str, ...] = ()) -> PKI:
    """Create what is missing of the CA, serving, client and ServiceAccount keys; the serving
    certificate is remade when its addresses (127.0.0.1, the `kubernetes` Service IP and
    `server_ips`, e.g. the real node's address the apiserver listens on) changed."""
    pki = PKI(Path(state_dir) / "pki")
    pki.dir.mkdir(parents=True, exist_ok=True)
    if not pki.ca.exists():
        _ec_key(pki.ca_key)
        _openssl("req", "-x509", "-new", "-key", str(pki.ca_key), "-subj", "/CN=chexflow-local-ca",
                 "-days", "365", "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", str(pki.ca),
                 cwd=pki.dir)
        for stale in (pki.serving_cert, *(pki.client(n)[0] for n in CLIENTS),
                      *pki.dir.glob("kubelet-*.crt")):
            stale.unlink(missing_ok=True)
    sans = ",".join([*(f"IP:{ip}" for ip in ("127.0.0.1", SERVICE_IP, *server_ips)),
                     "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
                     "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"])
    sans_file = pki.dir / "apiserver.sans"
    if not pki.serving_cert.exists() or not sans_file.exists() or sans_file.read_text() != sans:
        _signed_cert(pki, "apiserver", "/CN=kube-apiserver",
                     "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,"
                     f"keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName={sans}\n")
        sans_file.write_text(sans)
    for stem, (cn, org) in CLIENTS.items():
        if pki.client(stem)[0].exists():
            continue
        subject = f"/CN={cn}" + (f"/O={org}" if org else "")
        _signed_cert(pki, stem, subject,
                     "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                     "extendedKeyUsage=clientAuth\n")
    if not pki.sa_pub.exists():
        _ec_key(pki.sa_key)
        _openssl("pkey", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub),
                 cwd=pki.dir)
    return pki


def node_client(pki: PKI, node: str) -> str:
    """The client certificate of another real node's kubelet (`system:node:<node>`, as the Node
    authorizer expects), made when missing; returns its stem for write_kubeconfig."""
    stem = f"kubelet-{node}"
    if not pki.client(stem)[0].exists():
        _signed_cert(pki, stem, f"/CN=system:node:{node}/O=system:nodes",
                     "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                     "extendedKeyUsage=clientAuth\n")
    return stem


def server_cert(pki: PKI, stem: str, common_name: str, sans: str) -> tuple[Path, Path]:
    """<stem>.crt and <stem>.key: a serving certificate of the CA for `sans` (openssl's
    subjectAltName, e.g. `IP:10.0.0.5`), made when missing or made for other names."""
    crt, key, sans_file = (pki.dir / f"{stem}.{s}" for s in ("crt", "key", "sans"))
    if not crt.exists() or not sans_file.exists() or sans_file.read_text() != sans:
        _signed_cert(pki, stem, f"/CN={common_name}",
                     "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,"
                     f"keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName={sans}\n")
        sans_file.write_text(sans)
    return crt, key


def loopback_serving_cert(pki: PKI, name: str, folder: Path) -> Path:
    """`folder`/tls.crt and tls.key for a server on 127.0.0.1 (a webhook the apiserver calls
    there), signed by the cluster's CA; made once, returns `folder`."""
    if not (folder / "tls.crt").exists():
        _signed_cert(pki, name, f"/CN={name}",
                     "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,"
                     "keyEncipherment\nextendedKeyUsage=serverAuth\n"
                     "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        folder.mkdir(parents=True, exist_ok=True)
        (pki.dir / f"{name}.crt").rename(folder / "tls.crt")
        (pki.dir / f"{name}.key").rename(folder / "tls.key")
    return folder


def write_kubeconfig(path: Path, server: str, pki: PKI, client: str,
                     context: str = "chexflow-local") -> Path:
    """A kubeconfig for `server` authenticating with the named client certificate."""
    crt, key = pki.client(client)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context,
                      "cluster": {"server": server, "certificate-authority": str(pki.ca)}}],
        "users": [{"name": f"{context}-{client}",
                   "user": {"client-certificate": str(crt), "client-key": str(key)}}],
        "contexts": [{"name": context,
                      "context": {"cluster": context, "user": f"{context}-{client}"}}],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
