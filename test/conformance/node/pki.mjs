// Throwaway certificates for S7, made with the `openssl` command (Debian's
// openssl; nothing else is needed): a CA, a server certificate it signs for
// 127.0.0.1 and localhost, a client certificate (mTLS), and another CA that
// signed nothing the broker has. ECDSA P-256 keys in PKCS#8 PEM, valid for
// a day, written into a directory the caller owns.

import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

function openssl(dir, args) {
  try {
    execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "pipe", "pipe"], timeout: 30_000 });
  } catch (e) {
    if (e.code === "ENOENT") throw new Error("S7 needs the openssl command (Debian package openssl) to make certificates");
    throw new Error(`openssl ${args.join(" ")}: ${e.stderr ?? e.message}`);
  }
}

const keyArgs = (key) => ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key];

function makeCA(dir, name, cn) {
  const cert = join(dir, `${name}.pem`);
  const key = join(dir, `${name}-key.pem`);
  openssl(dir, ["req", "-x509", ...keyArgs(key), "-out", cert, "-days", "1", "-subj", `/CN=${cn}`,
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
  return { cert, key };
}

function issue(dir, ca, name, cn, extensions) {
  const cert = join(dir, `${name}.pem`);
  const key = join(dir, `${name}-key.pem`);
  const csr = join(dir, `${name}.csr`);
  const ext = join(dir, `${name}.ext`);
  writeFileSync(ext, `keyUsage=critical,digitalSignature\n${extensions}`);
  openssl(dir, ["req", "-new", ...keyArgs(key), "-out", csr, "-subj", `/CN=${cn}`]);
  openssl(dir, ["x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-set_serial",
    `0x${randomBytes(8).toString("hex")}`, "-days", "1", "-extfile", ext, "-out", cert]);
  return { cert, key };
}

// The PEM paths: ca, serverCert, serverKey, clientCert, clientKey (Common
// Name clientCN), otherCA.
export function makePKI(dir, clientCN = "payments-api") {
  const ca = makeCA(dir, "ca", "conformance CA");
  const other = makeCA(dir, "other-ca", "another CA");
  const server = issue(dir, ca, "broker", "broker", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
  const client = issue(dir, ca, "client", clientCN, "extendedKeyUsage=clientAuth\n");
  return {
    ca: ca.cert,
    otherCA: other.cert,
    serverCert: server.cert,
    serverKey: server.key,
    clientCert: client.cert,
    clientKey: client.key,
    clientCN,
  };
}
