package io.lockbroker.client;

import java.time.Duration;

/** Conversions between java.time and protobuf types. */
final class Protos {
  private Protos() {}

  static com.google.protobuf.Duration duration(Duration d) {
    return com.google.protobuf.Duration.newBuilder().setSeconds(d.getSeconds()).setNanos(d.getNano()).build();
  }

  static Duration duration(com.google.protobuf.Duration d) {
    return Duration.ofSeconds(d.getSeconds(), d.getNanos());
  }

  static long nanos(com.google.protobuf.Duration d) {
    return Math.max(0, duration(d).toNanos());
  }
}
