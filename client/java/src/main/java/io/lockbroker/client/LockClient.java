package io.lockbroker.client;

import com.google.common.util.concurrent.MoreExecutors;
import com.google.protobuf.ByteString;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.Grpc;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import io.lockbroker.v1.AcquireKind;
import io.lockbroker.v1.AcquireQueued;
import io.lockbroker.v1.AcquireRequest;
import io.lockbroker.v1.AcquireResponse;
import io.lockbroker.v1.CheckSequencerRequest;
import io.lockbroker.v1.GetLockRequest;
import io.lockbroker.v1.Holder;
import io.lockbroker.v1.LockServiceGrpc;
import io.lockbroker.v1.LockState;
import io.lockbroker.v1.ReleaseRequest;
import io.lockbroker.v1.Sequencer;
import io.lockbroker.v1.SetValueRequest;
import io.lockbroker.v1.WatchRequest;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executor;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.function.Supplier;
import java.util.regex.Pattern;

/**
 * The Java client of lockbroker: distributed locks, semaphore slots and
 * leader election held through a broker's gRPC stream, backed by Consul.
 *
 * <pre>{@code
 * try (LockClient client = LockClient.builder().target("127.0.0.1:8700").build();
 *      Lease lease = client.lock("jobs/nightly", LockOptions.defaults())) {
 *   lease.onLost(() -> log.warn("lost jobs/nightly"));
 *   store.write(data, lease.token());   // fencing: the store refuses older tokens
 * }
 * }</pre>
 *
 * <p>Give every broker replica as a target: a lease whose broker goes away
 * resumes on the next one with the same session and token, and a request
 * still waiting for the key moves to the next one when its broker goes away
 * or falls silent for three of its heartbeats. One client per
 * process is enough; it is thread-safe. {@link #close()} releases the
 * leases still held and closes the connections.
 */
public final class LockClient implements AutoCloseable {
  /** Extra time lock() waits past a bounded wait before giving up locally. */
  private static final long LOCAL_WAIT_GRACE_NANOS = TimeUnit.SECONDS.toNanos(10);
  /**
   * Heartbeats of the broker (AcquireQueued.heartbeat) a waiting stream may
   * miss before it is taken for stalled: a stopped broker keeps its
   * connection and never answers, so only its silence tells.
   */
  private static final int WAIT_STALL_BEATS = 3;
  /**
   * HTTP/2 keepalive of the channels the client builds: a ping after this
   * long without hearing from the broker while a call is open, and the
   * connection closed when the ping is not answered within
   * {@link #KEEPALIVE_TIMEOUT_SECONDS}. A call (a watch above all, which
   * hears from its broker only when the key changes) open on a stopped
   * broker then fails UNAVAILABLE after about 15 s and moves to the next
   * target. Same values as the Go, Python and Node libraries; the broker
   * accepts client pings 5 s apart or more.
   */
  private static final long KEEPALIVE_TIME_SECONDS = 10;
  private static final long KEEPALIVE_TIMEOUT_SECONDS = 5;
  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  private final List<String> targets;
  private final List<ManagedChannel> channels = new ArrayList<>();
  private final List<LockServiceGrpc.LockServiceStub> async = new ArrayList<>();
  private final List<LockServiceGrpc.LockServiceBlockingStub> blocking = new ArrayList<>();
  private final long lossMarginNanos;
  private final long callTimeoutNanos;
  private final ScheduledThreadPoolExecutor scheduler;
  private final ExecutorService pool;
  private final Set<Lease> leases = ConcurrentHashMap.newKeySet();
  private volatile boolean closed;

  private LockClient(Builder b) {
    this.targets = List.copyOf(b.targets);
    this.lossMarginNanos = b.lossMargin.toNanos();
    this.callTimeoutNanos = b.callTimeout.toNanos();
    this.scheduler = new ScheduledThreadPoolExecutor(1, daemon("lockbroker-timer"));
    this.scheduler.setRemoveOnCancelPolicy(true);
    this.pool = Executors.newCachedThreadPool(daemon("lockbroker-callback"));
    ChannelCredentials creds = b.tls ? tlsCredentials(b) : null;
    for (String t : targets) {
      ManagedChannelBuilder<?> cb = creds == null ? ManagedChannelBuilder.forTarget(t).usePlaintext()
          : tlsChannel(t, creds);
      cb.maxInboundMessageSize(16 << 20);
      // Before the configurer, which may change it.
      cb.keepAliveTime(KEEPALIVE_TIME_SECONDS, TimeUnit.SECONDS)
          .keepAliveTimeout(KEEPALIVE_TIMEOUT_SECONDS, TimeUnit.SECONDS);
      if (b.token != null) {
        cb.intercept(new BearerToken(b.token));
      }
      if (b.traceContext != null) {
        cb.intercept(new TraceContext(b.traceContext));
      }
      if (b.configurer != null) {
        b.configurer.accept(cb);
      }
      ManagedChannel ch = cb.build();
      channels.add(ch);
      async.add(LockServiceGrpc.newStub(ch));
      blocking.add(LockServiceGrpc.newBlockingStub(ch));
    }
  }

  /** Adds {@code authorization: Bearer <token>} to every call's headers. */
  private static final class BearerToken implements ClientInterceptor {
    private final Metadata headers = new Metadata();

    BearerToken(String token) {
      headers.put(AUTHORIZATION, "Bearer " + token);
    }

    @Override
    public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
      return new ForwardingClientCall.SimpleForwardingClientCall<Q, R>(next.newCall(method, options)) {
        @Override
        public void start(Listener<R> listener, Metadata h) {
          h.merge(headers);
          super.start(listener, h);
        }
      };
    }
  }

  private static final Metadata.Key<String> TRACEPARENT =
      Metadata.Key.of("traceparent", Metadata.ASCII_STRING_MARSHALLER);
  private static final Metadata.Key<String> TRACESTATE =
      Metadata.Key.of("tracestate", Metadata.ASCII_STRING_MARSHALLER);
  private static final Pattern TRACEPARENT_FORMAT =
      Pattern.compile("[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}");

  /**
   * Adds the caller's W3C trace context ({@code traceparent}, and
   * {@code tracestate}) to every call's headers, from the source the
   * builder was given, asked on the thread that starts the call. Nothing is
   * added without a valid traceparent, nor when the source throws: the
   * caller's tracing never fails a lock call.
   */
  private static final class TraceContext implements ClientInterceptor {
    private final Supplier<Map<String, String>> source;

    TraceContext(Supplier<Map<String, String>> source) {
      this.source = source;
    }

    @Override
    public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
      return new ForwardingClientCall.SimpleForwardingClientCall<Q, R>(next.newCall(method, options)) {
        @Override
        public void start(Listener<R> listener, Metadata h) {
          try {
            Map<String, String> carrier = source.get();
            String tp = carrier == null ? null : carrier.get("traceparent");
            if (tp != null && TRACEPARENT_FORMAT.matcher(tp).matches()) {
              h.put(TRACEPARENT, tp);
              String ts = carrier.get("tracestate");
              if (ts != null && !ts.isEmpty() && ts.length() <= 512) {
                h.put(TRACESTATE, ts);
              }
            }
          } catch (RuntimeException e) {
            // the caller's tracing: leave the call as it is
          }
          super.start(listener, h);
        }
      };
    }
  }

  private static ManagedChannelBuilder<?> tlsChannel(String target, ChannelCredentials creds) {
    try {
      return Grpc.newChannelBuilder(target, creds);
    } catch (UnsupportedOperationException e) {
      // Debian's netty 4.1.48: its JDK provider has no ALPN, which gRPC needs.
      throw new IllegalStateException("TLS needs ALPN, which this netty offers only through OpenSSL: put "
          + "netty-tcnative on the class path (see client/java/README.md): " + e.getMessage(), e);
    }
  }

  private static ChannelCredentials tlsCredentials(Builder b) {
    TlsChannelCredentials.Builder tb = TlsChannelCredentials.newBuilder();
    try {
      if (b.caCert != null) {
        tb.trustManager(b.caCert.toFile());
      }
      if (b.clientCert != null) {
        tb.keyManager(b.clientCert.toFile(), b.clientKey.toFile());
      }
    } catch (IOException e) {
      throw new UncheckedIOException("lockbroker TLS files: " + e.getMessage(), e);
    }
    return tb.build();
  }

  private static ThreadFactory daemon(String name) {
    AtomicInteger n = new AtomicInteger();
    return r -> {
      Thread t = new Thread(r, name + "-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }

  /** A builder; at least one {@link Builder#target} is required. */
  public static Builder builder() {
    return new Builder();
  }

  /** Configures a {@link LockClient}. */
  public static final class Builder {
    private final List<String> targets = new ArrayList<>();
    private Duration lossMargin = Duration.ofMillis(250);
    private Duration callTimeout = Duration.ofSeconds(5);
    private Consumer<ManagedChannelBuilder<?>> configurer;
    private boolean tls;
    private Path caCert;
    private Path clientCert;
    private Path clientKey;
    private String token;
    private Supplier<Map<String, String>> traceContext;

    private Builder() {}

    /** A broker replica, as a gRPC target ("127.0.0.1:8700", "dns:///brokers:8700"). */
    public Builder target(String target) {
      targets.add(Objects.requireNonNull(target));
      return this;
    }

    /** More broker replicas: leases resume on them when their broker goes away. */
    public Builder targets(String... more) {
      for (String t : more) {
        target(t);
      }
      return this;
    }

    /** As {@link #targets(String...)}. */
    public Builder targets(List<String> more) {
      more.forEach(this::target);
      return this;
    }

    /**
     * How long before a lease's guaranteed deadline the client reports the
     * loss when it hears nothing from any broker (default 250 ms). Make it
     * larger when the work under the lease needs time to stop.
     */
    public Builder lossMargin(Duration margin) {
      if (margin.isNegative()) {
        throw new IllegalArgumentException("loss margin must not be negative");
      }
      lossMargin = margin;
      return this;
    }

    /** Deadline of each unary call (release, state reads; default 5 s). */
    public Builder callTimeout(Duration timeout) {
      if (timeout.isNegative() || timeout.isZero()) {
        throw new IllegalArgumentException("call timeout must be positive");
      }
      callTimeout = timeout;
      return this;
    }

    /** TLS to the brokers, trusting the system's CAs (default: plaintext). */
    public Builder tls() {
      tls = true;
      return this;
    }

    /**
     * TLS to the brokers, trusting only the CA certificates in caCert (a PEM
     * file) for the brokers' certificates.
     */
    public Builder tls(Path caCert) {
      this.caCert = Objects.requireNonNull(caCert);
      return tls();
    }

    /**
     * mTLS: TLS as {@link #tls(Path)} (caCert null: the system's CAs), and
     * this client certificate chain and its private key (PEM files; the key
     * in PKCS#8, {@code BEGIN PRIVATE KEY}) for brokers that ask for one.
     * The broker knows the caller as {@code cn:<Common Name>} or
     * {@code uri:<URI SAN>} of the certificate.
     */
    public Builder tls(Path caCert, Path clientCert, Path clientKey) {
      this.caCert = caCert;
      this.clientCert = Objects.requireNonNull(clientCert);
      this.clientKey = Objects.requireNonNull(clientKey);
      return tls();
    }

    /**
     * Sends token as {@code authorization: Bearer <token>} on every call (the
     * broker knows the caller as {@code token-sha256:<hex>}). Use it with TLS
     * anywhere but loopback.
     */
    public Builder token(String token) {
      this.token = token == null || token.isEmpty() ? null : token;
      return this;
    }

    /**
     * Sends the caller's W3C trace context with every call: source is asked,
     * on the thread that starts the call, for a map with {@code traceparent}
     * (and {@code tracestate}), e.g. one filled by OpenTelemetry's
     * {@code W3CTraceContextPropagator.inject}. The broker's span for the
     * call is then its child. Debian's grpc-java 1.41 has no OpenTelemetry
     * integration; this needs none.
     */
    public Builder traceContext(Supplier<Map<String, String>> source) {
      this.traceContext = source;
      return this;
    }

    /**
     * Adjusts each replica's channel builder after the client's defaults
     * (plaintext unless {@link #tls()}, 16 MiB inbound messages, keepalive
     * pings after 10 s of silence with a 5 s timeout, the token):
     * interceptors, keepalive (the broker must permit the ping rate: 5 s
     * apart or more), or
     * transport security of your own when no {@code tls} option is set.
     */
    public Builder channelConfigurer(Consumer<ManagedChannelBuilder<?>> configurer) {
      this.configurer = configurer;
      return this;
    }

    /** The client; it connects lazily. */
    public LockClient build() {
      if (targets.isEmpty()) {
        throw new IllegalStateException("LockClient needs at least one target");
      }
      return new LockClient(this);
    }
  }

  // ---------------------------------------------------------------- locks

  /**
   * Takes the lock at key, waiting as long as {@code options.waitTimeout}
   * says (default: until interrupted), and returns the lease.
   *
   * <p>The request waits on the first target that answers. It starts again
   * on the next target when its stream breaks or, with more than one
   * target, hears nothing for three of the broker's heartbeats
   * ({@code AcquireQueued.heartbeat}; the silent stream is cancelled): a
   * stopped broker keeps its connection but says nothing, so its silence is
   * the only sign. Past the last target, lock throws
   * {@link UnavailableException}.
   *
   * @throws WaitTimeoutException a bounded wait ran out (with the holders)
   * @throws LockHeldException a zero wait found the key busy (with the holders)
   * @throws InterruptedException the thread was interrupted while waiting;
   *     the request is withdrawn
   * @throws LockBrokerException any other refusal (bad key, flag conflict,
   *     Consul unavailable, ...)
   */
  public Lease lock(String key, LockOptions options) throws InterruptedException {
    return acquire(options.toRequest(key), options.waitTimeout(), options.onQueued());
  }

  /** {@link #lock(String, LockOptions)} with the defaults. */
  public Lease lock(String key) throws InterruptedException {
    return lock(key, LockOptions.defaults());
  }

  /**
   * Takes the lock at key if it is free now; empty when it is held (or in
   * Consul's lock-delay). To learn who holds it, call {@link #lock} with
   * {@code waitTimeout(Duration.ZERO)} and read
   * {@link LockHeldException#holders()}.
   */
  public Optional<Lease> tryLock(String key, LockOptions options) throws InterruptedException {
    try {
      return Optional.of(lock(key, options.waitTimeout(Duration.ZERO)));
    } catch (LockHeldException e) {
      return Optional.empty();
    }
  }

  /** {@link #tryLock(String, LockOptions)} with the defaults. */
  public Optional<Lease> tryLock(String key) throws InterruptedException {
    return tryLock(key, LockOptions.defaults());
  }

  // ---------------------------------------------------------------- read-write locks

  /**
   * Takes a read (shared) hold of the read-write lock at key: many readers
   * hold it at once, never beside a writer. Waiters, readers and writers,
   * are served in arrival order: a reader that arrives behind a waiting
   * writer waits for that writer's turn, so neither side starves the other.
   * Waits as {@link #lock} does; the lease keeps itself as a lock's does
   * (keepalives, deadline, resume on another target as a reader).
   *
   * <pre>{@code
   * try (Lease l = client.readLock("config/routes")) {
   *   render(store.read(l.token()));
   * }
   * }</pre>
   *
   * <p>A read-write lock's key has a Consul layout of its own: a read or
   * write request on a plain lock or semaphore, and a lock or semaphore
   * request on a read-write lock, are refused with a
   * {@link LockBrokerException} of code FAILED_PRECONDITION and
   * {@link LockBrokerException#reason() reason} {@code LIMIT_CONFLICT}
   * ({@link LockBrokerException#isKindConflict()}), whose message and
   * {@link LockBrokerException#lockState() lockState()} name the kind found.
   */
  public Lease readLock(String key, LockOptions options) throws InterruptedException {
    return acquire(rw(options.toRequest(key), AcquireKind.ACQUIRE_KIND_READ), options.waitTimeout(),
        options.onQueued());
  }

  /** {@link #readLock(String, LockOptions)} with the defaults. */
  public Lease readLock(String key) throws InterruptedException {
    return readLock(key, LockOptions.defaults());
  }

  /**
   * Takes the write (exclusive) hold of the read-write lock at key: no
   * reader or other writer holds it meanwhile. Its {@link Lease#token()} is
   * above every token granted on the key before it, read or write, so a
   * resource that keeps the highest token seen refuses a stale reader's or
   * writer's change. Waits and fails as {@link #readLock} does.
   */
  public Lease writeLock(String key, LockOptions options) throws InterruptedException {
    return acquire(rw(options.toRequest(key), AcquireKind.ACQUIRE_KIND_WRITE), options.waitTimeout(),
        options.onQueued());
  }

  /** {@link #writeLock(String, LockOptions)} with the defaults. */
  public Lease writeLock(String key) throws InterruptedException {
    return writeLock(key, LockOptions.defaults());
  }

  /**
   * A read hold of key if one can be had now (no writer holds it or waits
   * for it); empty when it cannot. A kind conflict still throws.
   */
  public Optional<Lease> tryReadLock(String key, LockOptions options) throws InterruptedException {
    try {
      return Optional.of(readLock(key, options.waitTimeout(Duration.ZERO)));
    } catch (LockHeldException e) {
      return Optional.empty();
    }
  }

  /** {@link #tryReadLock(String, LockOptions)} with the defaults. */
  public Optional<Lease> tryReadLock(String key) throws InterruptedException {
    return tryReadLock(key, LockOptions.defaults());
  }

  /** The write hold of key if it is free now; empty when it is not. A kind conflict still throws. */
  public Optional<Lease> tryWriteLock(String key, LockOptions options) throws InterruptedException {
    try {
      return Optional.of(writeLock(key, options.waitTimeout(Duration.ZERO)));
    } catch (LockHeldException e) {
      return Optional.empty();
    }
  }

  /** {@link #tryWriteLock(String, LockOptions)} with the defaults. */
  public Optional<Lease> tryWriteLock(String key) throws InterruptedException {
    return tryWriteLock(key, LockOptions.defaults());
  }

  private static AcquireRequest rw(AcquireRequest req, AcquireKind kind) {
    return req.toBuilder().setKind(kind).build();
  }

  // ---------------------------------------------------------------- multi-key locks

  /**
   * Takes the locks at every key of keys (1 to 64, all different) at once,
   * all or nothing, in one Consul transaction with one session: no other
   * client ever sees a subset held by this request, and while it waits it
   * holds none of them. It waits in every key's queue with one place, so
   * two multi-key requests with overlapping keys never deadlock, and
   * single-key traffic on one of its keys cannot starve it. Waits as
   * {@link #lock} does.
   *
   * <pre>{@code
   * try (Lease l = client.lockAll(List.of("acct/a", "acct/b"))) {
   *   transfer(l.tokens().get(0), l.tokens().get(1));
   * }
   * }</pre>
   *
   * <p>The lease has one sequencer per key, in the order given
   * ({@link Lease#sequencers()}, {@link Lease#tokens()}); {@link Lease#key()}
   * and {@link Lease#token()} are the first key's. Losing any key ends the
   * whole hold: the broker releases the others, and {@link Lease#lostKey()}
   * names the key lost. Closing the lease releases every key. Each key is an
   * ordinary Consul lock key, so Consul's {@code api.Lock} clients exclude
   * correctly on any of them.
   *
   * @throws IllegalArgumentException keys is empty
   * @throws InvalidArgumentException the broker refused keys (a bad or
   *     repeated key, more than 64), naming the field
   */
  public Lease lockAll(List<String> keys, LockOptions options) throws InterruptedException {
    return acquire(multi(keys, options), options.waitTimeout(), options.onQueued());
  }

  /** {@link #lockAll(List, LockOptions)} with the defaults. */
  public Lease lockAll(List<String> keys) throws InterruptedException {
    return lockAll(keys, LockOptions.defaults());
  }

  /**
   * {@link #lockAll} if every key is free now; empty when any is held (none
   * is taken then). To learn who holds it, call {@link #lockAll} with
   * {@code waitTimeout(Duration.ZERO)} and read
   * {@link LockHeldException#holders()}.
   */
  public Optional<Lease> tryLockAll(List<String> keys, LockOptions options) throws InterruptedException {
    try {
      return Optional.of(lockAll(keys, options.waitTimeout(Duration.ZERO)));
    } catch (LockHeldException e) {
      return Optional.empty();
    }
  }

  /** {@link #tryLockAll(List, LockOptions)} with the defaults. */
  public Optional<Lease> tryLockAll(List<String> keys) throws InterruptedException {
    return tryLockAll(keys, LockOptions.defaults());
  }

  private static AcquireRequest multi(List<String> keys, LockOptions options) {
    if (keys.isEmpty()) {
      throw new IllegalArgumentException("lockAll needs at least one key");
    }
    for (String k : keys) {
      Objects.requireNonNull(k, "lockAll: a null key");
    }
    return options.toRequest(keys.get(0)).toBuilder().addAllKeys(keys.subList(1, keys.size())).build();
  }

  /**
   * Takes one of limit slots of the semaphore at prefix (Consul's semaphore
   * recipe: {@code prefix/<session>} and {@code prefix/.lock}); every holder
   * must use the same limit (else FAILED_PRECONDITION, reason
   * LIMIT_CONFLICT). Waits as {@link #lock} does.
   */
  public Lease semaphore(String prefix, int limit, LockOptions options) throws InterruptedException {
    return lock(prefix, options.semaphore(limit));
  }

  /** Takes a semaphore slot if one is free now; empty when all are taken. */
  public Optional<Lease> trySemaphore(String prefix, int limit, LockOptions options)
      throws InterruptedException {
    return tryLock(prefix, options.semaphore(limit));
  }

  private Lease acquire(AcquireRequest req, Duration wait, Consumer<AcquireQueued> onQueued)
      throws InterruptedException {
    if (closed) {
      throw new IllegalStateException("LockClient is closed");
    }
    WaitPlace place = new WaitPlace(req);
    LockBrokerException last = null;
    for (int r = 0; r < targets.size(); r++) {
      Pending p = new Pending(req, place, onQueued);
      AcquireCall call = openAcquire(r, place.request(), p);
      try {
        // A live broker answers at once (queued, acquired or an error); a
        // stalled one is left for the next target.
        try {
          p.answered.get(callTimeoutNanos, TimeUnit.NANOSECONDS);
        } catch (TimeoutException e) {
          p.abandon(call);
          last = new UnavailableException(LockBrokerException.local(Status.Code.UNAVAILABLE, "",
              "no answer from the broker at " + targets.get(r) + " within " + callTimeoutNanos / 1_000_000 + " ms"),
              null);
          continue;
        }
        if (wait == null) {
          return p.result.get();
        }
        return p.result.get(wait.toNanos() + LOCAL_WAIT_GRACE_NANOS, TimeUnit.NANOSECONDS);
      } catch (ExecutionException e) {
        LockBrokerException ex = fromAcquire(e.getCause());
        if (place.gone(ex)) {
          r--; // the same target again, with the original request: a fresh wait
          continue;
        }
        if (ex instanceof UnavailableException && r + 1 < targets.size()) {
          last = ex;
          continue;
        }
        if ((ex instanceof LockHeldException || ex instanceof WaitTimeoutException)
            && ex.lockState().isEmpty()) {
          try { // a broker that sends no LockState detail: read who holds it
            ex.fillLockState(unary(r, s -> s.getLock(GetLockRequest.newBuilder()
                .setKey(req.getKey()).build()).getState()));
          } catch (LockBrokerException ignored) {
            // the error stands without holders
          }
        }
        throw ex;
      } catch (InterruptedException e) {
        p.abandon(call);
        throw e;
      } catch (TimeoutException e) {
        p.abandon(call);
        throw new WaitTimeoutException(LockBrokerException.local(Status.Code.DEADLINE_EXCEEDED,
            "", "no answer from the broker at " + targets.get(r) + " within the wait (" + wait
            + ") and a grace period"), null);
      }
    }
    throw last;
  }

  private static LockBrokerException fromAcquire(Throwable t) {
    LockBrokerException e = LockBrokerException.from(t);
    if (e.code() == Status.Code.DEADLINE_EXCEEDED && !(e instanceof WaitTimeoutException)) {
      return new WaitTimeoutException(LockBrokerException.details(t), t);
    }
    return e;
  }

  /**
   * Waits on one Acquire stream for its grant. With another target to go
   * to, a stream silent for {@link #WAIT_STALL_BEATS} of its broker's
   * heartbeats is cancelled and the wait fails UNAVAILABLE, so that
   * {@link #acquire} moves on as it does for a broken stream.
   */
  private final class Pending implements AcquireCall.Listener {
    final AcquireRequest req;
    private final WaitPlace place;
    private final Consumer<AcquireQueued> onQueued;
    final CompletableFuture<Lease> result = new CompletableFuture<>();
    final CompletableFuture<Void> answered = new CompletableFuture<>();
    private final boolean watchSilence = targets.size() > 1;
    // The silence watch; guarded by `this`.
    private long heartbeatNanos; // the last heartbeat announced; 0: none, silence tells nothing
    private long lastHeardNanos;
    private ScheduledFuture<?> silenceTimer;

    Pending(AcquireRequest req, WaitPlace place, Consumer<AcquireQueued> onQueued) {
      this.req = req;
      this.place = place;
      this.onQueued = onQueued;
      result.whenComplete((lease, error) -> stopSilenceWatch());
    }

    @Override
    public void onResponse(AcquireCall call, AcquireResponse r, long receivedNanos) {
      answered.complete(null);
      switch (r.getEventCase()) {
        case ACQUIRED: {
          Lease lease = new Lease(LockClient.this, req, call, r.getAcquired(), receivedNanos);
          leases.add(lease);
          if (!result.complete(lease)) {
            lease.abandon();
          }
          break;
        }
        case LOST:
          // A grant the broker could not announce safely (AcquireLost).
          result.completeExceptionally(new LockBrokerException(Status.Code.ABORTED, "SESSION_LOST",
              "the stream ended with lost before the grant: "
                  + LockLostException.reasonName(r.getLost().getReason())
                  + ": " + r.getLost().getDetail()));
          call.cancel("lost before the grant");
          break;
        default: // queued: keep waiting
          heard(call, r, receivedNanos);
          if (r.hasQueued()) {
            place.heard(r.getQueued());
            tellQueued(r.getQueued());
          }
          break;
      }
    }

    /**
     * Tells the onQueued listener, on the call's thread (so in order); what
     * it throws goes to the thread's uncaught-exception handler, not into
     * the wait.
     */
    private void tellQueued(AcquireQueued q) {
      if (onQueued == null || result.isDone()) {
        return;
      }
      try {
        onQueued.accept(q);
      } catch (RuntimeException e) {
        Thread t = Thread.currentThread();
        t.getUncaughtExceptionHandler().uncaughtException(t, e);
      }
    }

    /** An event restarts the silence count; a queued one may announce a new heartbeat. */
    private synchronized void heard(AcquireCall call, AcquireResponse r, long receivedNanos) {
      if (!watchSilence || result.isDone()) {
        return;
      }
      long beat = Protos.nanos(r.getQueued().getHeartbeat());
      if (beat > 0) {
        heartbeatNanos = beat;
      }
      lastHeardNanos = receivedNanos;
      if (heartbeatNanos > 0 && silenceTimer == null) {
        silenceTimer = schedule(() -> checkSilence(call), WAIT_STALL_BEATS * heartbeatNanos);
      }
    }

    /**
     * The silence timer ran: fails the wait if nothing came since, else
     * counts on from the last event. Should the grant arrive just now, it
     * finds the wait failed and ends the lease nobody will see.
     */
    private void checkSilence(AcquireCall call) {
      LockBrokerException stalled;
      synchronized (this) {
        silenceTimer = null;
        if (result.isDone()) {
          return;
        }
        long left = lastHeardNanos + WAIT_STALL_BEATS * heartbeatNanos - System.nanoTime();
        if (left > 0) {
          silenceTimer = schedule(() -> checkSilence(call), left);
          return;
        }
        stalled = new UnavailableException(LockBrokerException.local(Status.Code.UNAVAILABLE, "",
            "the broker at " + targets.get(call.replica) + " was silent for " + WAIT_STALL_BEATS
            + " heartbeats of " + heartbeatNanos / 1_000_000 + " ms while the request waited"), null);
      }
      if (result.completeExceptionally(stalled)) {
        call.cancel("the broker was silent while the request waited");
      }
    }

    private synchronized void stopSilenceWatch() {
      if (silenceTimer != null) {
        silenceTimer.cancel(false);
        silenceTimer = null;
      }
    }

    @Override
    public void onEnd(AcquireCall call, Throwable error) {
      answered.complete(null);
      result.completeExceptionally(error != null ? error
          : new LockBrokerException(Status.Code.UNKNOWN, "", "the broker ended the stream before the grant"));
    }

    /** The caller gave up: withdraw the request, or end a grant it will not see. */
    void abandon(AcquireCall call) {
      if (!result.cancel(false) && !result.isCompletedExceptionally()) {
        result.join().abandon();
      }
      call.cancel("the caller stopped waiting");
    }
  }

  // ---------------------------------------------------------------- watch and state

  /**
   * Follows the state of key: the state now, then after every change. "No
   * holder" is a state of its own (a free lock, a leader that resigned or
   * failed). The first state has arrived when this returns; a refused
   * request (bad key) throws here. When the broker goes away the watch moves
   * to the next target and starts again with the state now.
   */
  public LockWatch watch(String key) throws InterruptedException {
    return new LockWatch(this, WatchRequest.newBuilder().setKey(key).build());
  }

  /**
   * Follows every lock and semaphore under prefix/ (and prefix itself): each
   * state is one key's; {@link LockWatch#snapshotComplete()} turns true once
   * the initial state of every key has been delivered.
   */
  public LockWatch watchPrefix(String prefix) throws InterruptedException {
    return new LockWatch(this, WatchRequest.newBuilder().setKey(prefix).setPrefix(true).build());
  }

  /** The state of key, read consistently by the broker. */
  public LockState getLock(String key) {
    return unary(0, s -> s.getLock(GetLockRequest.newBuilder().setKey(key).build()).getState());
  }

  /**
   * Leader election on key (see {@link Election}), each campaign with
   * options (TTL, lock-delay, session name; the value is the campaign's).
   */
  public Election election(String key, LockOptions options) {
    return new Election(this, key, options);
  }

  /** {@link #election(String, LockOptions)} with the defaults. */
  public Election election(String key) {
    return election(key, LockOptions.defaults());
  }

  /**
   * The current holder of the lock at key (leader discovery: its value is
   * the leader's identity); empty when nobody holds it.
   *
   * @deprecated use {@code election(key).leader()}: in the other libraries
   *     {@code leader(key)} is an election, and {@code election(key)} is the
   *     name every library shares.
   */
  @Deprecated
  public Optional<Holder> leader(String key) {
    return election(key).leader();
  }

  /** Whether seq is still the current grant of its key (Chubby's CheckSequencer). */
  public boolean checkSequencer(Sequencer seq) {
    return unary(0, s -> s.checkSequencer(CheckSequencerRequest.newBuilder().setSequencer(seq).build())
        .getCurrent());
  }

  /** Releases every lease still held and closes the connections. */
  @Override
  public void close() {
    closed = true;
    for (Lease l : new ArrayList<>(leases)) {
      l.close();
    }
    for (ManagedChannel ch : channels) {
      ch.shutdown();
    }
    for (ManagedChannel ch : channels) {
      try {
        if (!ch.awaitTermination(2, TimeUnit.SECONDS)) {
          ch.shutdownNow();
        }
      } catch (InterruptedException e) {
        ch.shutdownNow();
        Thread.currentThread().interrupt();
      }
    }
    scheduler.shutdownNow();
    // The callback pool is not shut down: gRPC may still deliver the end of
    // a cancelled stream; its idle daemon threads end after a minute.
  }

  // ---------------------------------------------------------------- plumbing for Lease and LockWatch

  AcquireCall openAcquire(int replica, AcquireRequest req, AcquireCall.Listener listener) {
    AcquireCall call = new AcquireCall(replica, listener);
    async.get(replica).acquire(req, call);
    return call;
  }

  LockServiceGrpc.LockServiceStub asyncStub(int replica) {
    return async.get(replica);
  }

  void release(int replica, Sequencer seq) {
    ReleaseRequest req = ReleaseRequest.newBuilder().setKey(seq.getKey())
        .setSessionId(seq.getSessionId()).setToken(seq.getToken()).build();
    unary(replica, s -> s.release(req));
  }

  void setValue(int replica, Sequencer seq, ByteString value) {
    SetValueRequest req = SetValueRequest.newBuilder().setKey(seq.getKey())
        .setSessionId(seq.getSessionId()).setToken(seq.getToken()).setValue(value).build();
    unary(replica, s -> s.setValue(req));
  }

  /**
   * Runs call on replica first, then on the others while the broker is
   * unavailable or does not answer in time.
   */
  private <T> T unary(int first, Function<LockServiceGrpc.LockServiceBlockingStub, T> call) {
    if (closed && leases.isEmpty()) {
      throw new IllegalStateException("LockClient is closed");
    }
    LockBrokerException last = null;
    for (int i = 0; i < targets.size(); i++) {
      int r = (first + i) % targets.size();
      try {
        return call.apply(blocking.get(r).withDeadlineAfter(callTimeoutNanos, TimeUnit.NANOSECONDS));
      } catch (StatusRuntimeException e) {
        last = LockBrokerException.from(e);
        if (last.code() != Status.Code.UNAVAILABLE && last.code() != Status.Code.DEADLINE_EXCEEDED) {
          throw last;
        }
      }
    }
    throw last;
  }

  Executor newSerialExecutor() {
    return MoreExecutors.newSequentialExecutor(pool);
  }

  Executor callbackExecutor() {
    return pool;
  }

  /** Runs task after delayNanos; null (nothing runs) once the client is closed. */
  ScheduledFuture<?> schedule(Runnable task, long delayNanos) {
    try {
      return scheduler.schedule(task, Math.max(0, delayNanos), TimeUnit.NANOSECONDS);
    } catch (RejectedExecutionException e) {
      return null;
    }
  }

  long callTimeoutNanos() {
    return callTimeoutNanos;
  }

  long lossMarginNanos() {
    return lossMarginNanos;
  }

  int targetCount() {
    return targets.size();
  }

  String target(int replica) {
    return targets.get(replica);
  }

  void resetConnectBackoff(int replica) {
    channels.get(replica).resetConnectBackoff();
  }

  void forget(Lease lease) {
    leases.remove(lease);
  }
}
