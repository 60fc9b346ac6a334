"""Throwaway certificates for S7, made with the `openssl` command (Debian's
openssl; nothing else is needed): a CA, a server certificate it signs for
127.0.0.1 and localhost, a client certificate (mTLS), and another CA that
signed nothing the broker has. ECDSA P-256 keys in PKCS#8 PEM, valid for a
day, written into a directory the caller owns.
"""

import os
import shutil
import subprocess

OPENSSL = shutil.which("openssl")


class PKI:
    """Paths of the PEM files: ca, server_cert, server_key, client_cert,
    client_key (Common Name `client_cn`), other_ca."""

    def __init__(self, directory, client_cn="payments-api"):
        if OPENSSL is None:
            raise RuntimeError("S7 needs the openssl command (Debian package openssl) to make certificates")
        self.dir = directory
        self.client_cn = client_cn
        self.ca, ca_key = self._ca("ca", "conformance CA")
        self.other_ca, _ = self._ca("other-ca", "another CA")
        self.server_cert, self.server_key = self._issue(
            "broker", "broker", ca_key, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
        self.client_cert, self.client_key = self._issue(
            "client", client_cn, ca_key, "extendedKeyUsage=clientAuth\n")

    def _path(self, name):
        return os.path.join(self.dir, name)

    def _run(self, *args):
        r = subprocess.run([OPENSSL, *args], cwd=self.dir, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"openssl {' '.join(args)}: {r.stderr.strip()}")

    def _key_args(self, key):
        return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key]

    def _ca(self, name, cn):
        cert, key = self._path(f"{name}.pem"), self._path(f"{name}-key.pem")
        self._run("req", "-x509", *self._key_args(key), "-out", cert, "-days", "1", "-subj", f"/CN={cn}",
                  "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return cert, key

    def _issue(self, name, cn, ca_key, extensions):
        cert, key = self._path(f"{name}.pem"), self._path(f"{name}-key.pem")
        csr, ext = self._path(f"{name}.csr"), self._path(f"{name}.ext")
        with open(ext, "w", encoding="ascii") as f:
            f.write("keyUsage=critical,digitalSignature\n" + extensions)
        self._run("req", "-new", *self._key_args(key), "-out", csr, "-subj", f"/CN={cn}")
        self._run("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", ca_key, "-set_serial",
                  "0x" + os.urandom(8).hex(), "-days", "1", "-extfile", ext, "-out", cert)
        return cert, key
