package io.delayd.client;

import io.grpc.CallCredentials;
import io.grpc.Metadata;
import io.grpc.Status;
import java.util.concurrent.Executor;

/**
 * Call credentials that send a delayd API key as {@code authorization: Bearer <key>}:
 * {@code stub.withCallCredentials(new BearerToken(key))}.
 */
public final class BearerToken extends CallCredentials {
  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  private final String key;

  public BearerToken(String key) {
    if (key == null || key.isEmpty()) {
      throw new IllegalArgumentException("key: a delayd API key is required");
    }
    this.key = key;
  }

  @Override
  public void applyRequestMetadata(RequestInfo info, Executor executor, MetadataApplier applier) {
    try {
      Metadata headers = new Metadata();
      headers.put(AUTHORIZATION, "Bearer " + key);
      applier.apply(headers);
    } catch (RuntimeException e) {
      applier.fail(Status.UNAUTHENTICATED.withCause(e));
    }
  }

  @Override
  public void thisUsesUnstableApi() {}
}
