package io.lockbroker.testing;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * Throwaway certificates for S7, made with the {@code openssl} command
 * (Debian's openssl; nothing else is needed): a CA, a server certificate it
 * signs for 127.0.0.1 and localhost, a client certificate (mTLS), and
 * another CA that signed nothing the broker has. ECDSA P-256 keys in PKCS#8
 * PEM (what grpc-netty reads), valid for a day, in a directory the caller
 * owns.
 */
public final class Pki {
  private static final SecureRandom RANDOM = new SecureRandom();

  /** The CA that signed the server and client certificates. */
  public final Path ca;
  /** A CA that signed nothing here. */
  public final Path otherCa;
  /** The broker's certificate and key. */
  public final Path serverCert;
  public final Path serverKey;
  /** The client's certificate (Common Name {@link #clientCn}) and key. */
  public final Path clientCert;
  public final Path clientKey;
  public final String clientCn;

  private final Path dir;

  private Pki(Path dir, String clientCn) throws IOException, InterruptedException {
    this.dir = dir;
    this.clientCn = clientCn;
    Path caKey = dir.resolve("ca-key.pem");
    this.ca = makeCa("ca", "conformance CA", caKey);
    this.otherCa = makeCa("other-ca", "another CA", dir.resolve("other-ca-key.pem"));
    this.serverCert = issue("broker", "broker", caKey,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
    this.serverKey = dir.resolve("broker-key.pem");
    this.clientCert = issue("client", clientCn, caKey, "extendedKeyUsage=clientAuth\n");
    this.clientKey = dir.resolve("client-key.pem");
  }

  /** Makes the files in dir. */
  public static Pki make(Path dir, String clientCn) throws IOException, InterruptedException {
    return new Pki(dir, clientCn);
  }

  private static List<String> keyArgs(Path key) {
    return List.of("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key.toString());
  }

  private Path makeCa(String name, String cn, Path key) throws IOException, InterruptedException {
    Path cert = dir.resolve(name + ".pem");
    List<String> args = new ArrayList<>(List.of("req", "-x509"));
    args.addAll(keyArgs(key));
    args.addAll(List.of("-out", cert.toString(), "-days", "1", "-subj", "/CN=" + cn,
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"));
    openssl(args);
    return cert;
  }

  private Path issue(String name, String cn, Path caKey, String extensions) throws IOException, InterruptedException {
    Path cert = dir.resolve(name + ".pem");
    Path csr = dir.resolve(name + ".csr");
    Path ext = dir.resolve(name + ".ext");
    Files.writeString(ext, "keyUsage=critical,digitalSignature\n" + extensions, StandardCharsets.US_ASCII);
    List<String> req = new ArrayList<>(List.of("req", "-new"));
    req.addAll(keyArgs(dir.resolve(name + "-key.pem")));
    req.addAll(List.of("-out", csr.toString(), "-subj", "/CN=" + cn));
    openssl(req);
    byte[] serial = new byte[8];
    RANDOM.nextBytes(serial);
    openssl(List.of("x509", "-req", "-in", csr.toString(), "-CA", ca.toString(), "-CAkey", caKey.toString(),
        "-set_serial", "0x" + HexFormat.of().formatHex(serial), "-days", "1", "-extfile", ext.toString(),
        "-out", cert.toString()));
    return cert;
  }

  private void openssl(List<String> args) throws IOException, InterruptedException {
    List<String> cmd = new ArrayList<>();
    cmd.add("openssl");
    cmd.addAll(args);
    Process p;
    try {
      p = new ProcessBuilder(cmd).directory(dir.toFile()).redirectErrorStream(true).start();
    } catch (IOException e) {
      throw new IOException("S7 needs the openssl command (Debian package openssl) to make certificates: " + e, e);
    }
    p.getOutputStream().close();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    if (!p.waitFor(30, TimeUnit.SECONDS)) {
      p.destroyForcibly();
      throw new IOException("openssl " + String.join(" ", args) + ": no exit within 30 s");
    }
    if (p.exitValue() != 0) {
      throw new IOException("openssl " + String.join(" ", args) + ": " + out.trim());
    }
  }
}
