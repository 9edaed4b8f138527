package io.delayd.example;

import com.google.protobuf.Duration;
import delayd.v1.DeliveryOuterClass.Delivery;
import delayd.v1.DeliveryOuterClass.StreamDeliveriesRequest;
import delayd.v1.DeliveryOuterClass.StreamDeliveriesResponse;
import delayd.v1.DeliveryOuterClass.TokenResult;
import delayd.v1.DeliveryOuterClass.TokenStatus;
import delayd.v1.DeliveryServiceGrpc;
import delayd.v1.TaskOuterClass.GetTaskRequest;
import delayd.v1.TaskOuterClass.UpsertTaskRequest;
import delayd.v1.TaskServiceGrpc;
import io.delayd.client.BearerToken;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.nio.charset.StandardCharsets;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * Upserts tasks due now, receives them on one StreamDeliveries stream, acks each batch on the
 * same stream (answered on it), and checks that the acked tasks are gone.
 *
 * <pre>java ... io.delayd.example.StreamDeliveriesExample localhost:7070 orders 10 [api-key]</pre>
 *
 * <p>Prints "acked N of N" and exits 0, or names what went wrong and exits 1.
 */
public final class StreamDeliveriesExample {
  public static void main(String[] args) throws Exception {
    if (args.length < 3) {
      System.err.println("usage: StreamDeliveriesExample host:port namespace count [api-key]");
      System.exit(2);
    }
    String target = args[0];
    String namespace = args[1];
    int count = Integer.parseInt(args[2]);
    ManagedChannel channel = ManagedChannelBuilder.forTarget(target).usePlaintext().build();
    try {
      TaskServiceGrpc.TaskServiceBlockingStub tasks = TaskServiceGrpc.newBlockingStub(channel);
      DeliveryServiceGrpc.DeliveryServiceStub deliveries = DeliveryServiceGrpc.newStub(channel);
      if (args.length > 3) {
        BearerToken key = new BearerToken(args[3]);
        tasks = tasks.withCallCredentials(key);
        deliveries = deliveries.withCallCredentials(key);
      }
      int acked = run(tasks, deliveries, namespace, count);
      System.out.println("acked " + acked + " of " + count);
      System.exit(acked == count ? 0 : 1);
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
  }

  static int run(
      TaskServiceGrpc.TaskServiceBlockingStub tasks,
      DeliveryServiceGrpc.DeliveryServiceStub deliveries,
      String namespace,
      int count)
      throws Exception {
    Set<String> ids = new HashSet<>();
    for (int i = 0; i < count; i++) {
      String id = "java-" + i;
      ids.add(id);
      tasks
          .withDeadlineAfter(10, TimeUnit.SECONDS)
          .upsertTask(
              UpsertTaskRequest.newBuilder()
                  .setNamespace(namespace)
                  .setId(id)
                  .setKind("java.example")
                  .setPayload(com.google.protobuf.ByteString.copyFrom("{\"n\":" + i + "}", StandardCharsets.UTF_8))
                  .setDelay(Duration.newBuilder().setSeconds(0))
                  .build());
    }

    CompletableFuture<Integer> done = new CompletableFuture<>();
    Set<String> seen = new HashSet<>();
    int[] ackedOk = {0};
    StreamObserver<StreamDeliveriesRequest>[] send = new StreamObserver[1];
    send[0] =
        deliveries.streamDeliveries(
            new StreamObserver<StreamDeliveriesResponse>() {
              @Override
              public void onNext(StreamDeliveriesResponse resp) {
                StreamDeliveriesRequest.Builder acks = StreamDeliveriesRequest.newBuilder();
                for (Delivery d : resp.getDeliveriesList()) {
                  if (!seen.add(d.getTask().getId()) || !ids.contains(d.getTask().getId())) {
                    done.completeExceptionally(new AssertionError("unexpected delivery " + d.getTask().getId()));
                  }
                  acks.addAckTokens(d.getToken());
                }
                if (acks.getAckTokensCount() > 0) {
                  synchronized (send) {
                    send[0].onNext(acks.build());
                  }
                }
                for (TokenResult r : resp.getAckResultsList()) {
                  if (r.getStatus() != TokenStatus.TOKEN_STATUS_OK) {
                    done.completeExceptionally(new AssertionError("ack answered " + r.getStatus()));
                  } else if (++ackedOk[0] == ids.size()) {
                    done.complete(ackedOk[0]);
                  }
                }
              }

              @Override
              public void onError(Throwable t) {
                done.completeExceptionally(t);
              }

              @Override
              public void onCompleted() {
                done.completeExceptionally(new AssertionError("stream ended early"));
              }
            });
    synchronized (send) {
      send[0].onNext(
          StreamDeliveriesRequest.newBuilder().setNamespace(namespace).setMaxInFlight(64).setMaxBatch(100).build());
    }
    int acked;
    try {
      acked = done.get(30, TimeUnit.SECONDS);
    } finally {
      synchronized (send) {
        send[0].onCompleted();
      }
    }

    // Acked tasks are deleted.
    for (String id : ids) {
      try {
        tasks.withDeadlineAfter(10, TimeUnit.SECONDS)
            .getTask(GetTaskRequest.newBuilder().setNamespace(namespace).setId(id).build());
        throw new AssertionError("task " + id + " is still there after its ack");
      } catch (StatusRuntimeException e) {
        if (e.getStatus().getCode() != Status.Code.NOT_FOUND) {
          throw e;
        }
      }
    }
    return acked;
  }
}
