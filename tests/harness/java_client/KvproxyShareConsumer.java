import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.ShareMemberDescription;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Members of one share group (KIP-932, {@link KafkaShareConsumer}) as an application runs them,
 * driven by the test harness.
 *
 * <p>Usage: {@code KvproxyShareConsumer share --bootstrap H:P --topic T --group G --members N
 * --expect E [--mode implicit|explicit] [--release-prefix P] [--reject-prefix Q]
 * [--timeout-ms MS] [--prop k=v]...}. The group is first set to start at the earliest offset
 * (group config {@code share.auto.offset.reset}; the default, latest, skips what is already
 * there). Then N threads, each its own consumer of group G, consume T until E records of it are
 * settled (accepted or rejected). In explicit mode a value starting with P is released on its
 * first delivery (the broker delivers it again, delivery count 2) and one starting with Q is
 * rejected; everything else is accepted. Once settled, one end marker per partition is produced
 * and the members go on until every marker is settled: a rejected record delivered again before
 * the markers would show in the report. Each batch is committed with commitSync.
 *
 * <p>Prints one JSON line: per member its records ({@code [partition, offset, value,
 * delivery count, acknowledgement]}), commitSync's outcome per partition and the commit
 * callback's, any exception; the group as the Admin client describes it (members, assignments,
 * coordinator) while every member is still in it; and whether the deadline passed first.
 */
public final class KvproxyShareConsumer {
    private static final String MARKER = "end-marker-";

    private KvproxyShareConsumer() {}

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = new HashMap<>();
        Properties props = new Properties();
        for (int i = 1; i + 1 < argv.length; i += 2) {
            if (argv[i].equals("--prop")) {
                String[] kv = argv[i + 1].split("=", 2);
                props.put(kv[0], kv[1]);
            } else {
                args.put(argv[i].substring(2), argv[i + 1]);
            }
        }
        if (!argv[0].equals("share")) {
            throw new IllegalArgumentException("unknown command " + argv[0]);
        }
        props.put("bootstrap.servers", args.get("bootstrap"));
        System.out.println(new Run(args, props).run());
        System.out.flush();
    }

    /** One run of the group: shared state of its members, read by the main thread. */
    private static final class Run {
        final String topic;
        final String group;
        final int count;
        final int expect;
        final boolean explicit;
        final String releasePrefix;
        final String rejectPrefix;
        final long deadline;
        final Properties props;
        final Set<String> settled = ConcurrentHashMap.newKeySet();
        final Set<String> markersSettled = ConcurrentHashMap.newKeySet();
        final AtomicBoolean markersSent = new AtomicBoolean(false);
        final AtomicBoolean stop = new AtomicBoolean(false);
        volatile int partitions = -1;

        Run(Map<String, String> args, Properties props) {
            this.topic = args.get("topic");
            this.group = args.get("group");
            this.count = Integer.parseInt(args.getOrDefault("members", "2"));
            this.expect = Integer.parseInt(args.get("expect"));
            this.explicit = args.getOrDefault("mode", "implicit").equals("explicit");
            this.releasePrefix = args.getOrDefault("release-prefix", "release-");
            this.rejectPrefix = args.getOrDefault("reject-prefix", "reject-");
            this.deadline = System.currentTimeMillis()
                    + Long.parseLong(args.getOrDefault("timeout-ms", "90000"));
            this.props = props;
        }

        String run() throws Exception {
            try (Admin admin = Admin.create(props)) {
                startAtEarliest(admin);
                partitions = admin.describeTopics(List.of(topic)).allTopicNames().get()
                        .get(topic).partitions().size();
                List<Member> members = new ArrayList<>();
                for (int i = 0; i < count; i++) {
                    members.add(new Member(this, "member-" + i));
                }
                for (Member member : members) {
                    member.thread.start();
                }
                while (settled.size() < expect && !late()) {
                    Thread.sleep(50);
                }
                String description = describe(admin);
                if (!late()) {
                    sendMarkers();
                }
                while (markersSettled.size() < partitions && !late()) {
                    Thread.sleep(50);
                }
                boolean timedOut = markersSettled.size() < partitions;
                stop.set(true);
                List<String> reports = new ArrayList<>();
                for (Member member : members) {
                    member.thread.join(60_000);
                    reports.add(member.report());
                }
                return "{\"members\":[" + String.join(",", reports) + "],\"group\":"
                        + description + ",\"partitions\":" + partitions
                        + ",\"timed_out\":" + timedOut + "}";
            }
        }

        boolean late() {
            return System.currentTimeMillis() > deadline;
        }

        void startAtEarliest(Admin admin) throws Exception {
            ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
            AlterConfigOp earliest = new AlterConfigOp(
                    new ConfigEntry("share.auto.offset.reset", "earliest"),
                    AlterConfigOp.OpType.SET);
            admin.incrementalAlterConfigs(Map.of(resource, List.of(earliest))).all().get();
        }

        /** The group while every member is in it: state, coordinator, each member's partitions. */
        String describe(Admin admin) throws Exception {
            ShareGroupDescription description = admin.describeShareGroups(List.of(group))
                    .describedGroups().get(group).get();
            List<String> members = new ArrayList<>();
            for (ShareMemberDescription member : description.members()) {
                List<Integer> assigned = new ArrayList<>();
                for (TopicPartition tp : member.assignment().topicPartitions()) {
                    assigned.add(tp.partition());
                }
                Collections.sort(assigned);
                members.add("[" + quote(member.clientId()) + "," + assigned + "]");
            }
            Node coordinator = description.coordinator();
            return "{\"state\":" + quote(description.groupState().toString())
                    + ",\"coordinator\":[" + coordinator.id() + "," + quote(coordinator.host())
                    + "," + coordinator.port() + "],\"members\":[" + String.join(",", members)
                    + "]}";
        }

        void sendMarkers() throws Exception {
            try (KafkaProducer<String, String> producer =
                    new KafkaProducer<>(props, new StringSerializer(), new StringSerializer())) {
                for (int p = 0; p < partitions; p++) {
                    producer.send(new ProducerRecord<>(topic, p, "marker", MARKER + p)).get();
                }
            }
            markersSent.set(true);
        }

        /** What this run does with one delivery (explicit mode); implicit mode accepts all. */
        AcknowledgeType decide(ConsumerRecord<String, String> record) {
            String value = record.value() == null ? "" : record.value();
            if (explicit && value.startsWith(releasePrefix)
                    && record.deliveryCount().orElse((short) 1) == 1) {
                return AcknowledgeType.RELEASE;
            }
            if (explicit && value.startsWith(rejectPrefix)) {
                return AcknowledgeType.REJECT;
            }
            return AcknowledgeType.ACCEPT;
        }
    }

    /** One consumer of the group on a thread of its own. */
    private static final class Member {
        final Run run;
        final String clientId;
        final Thread thread;
        final List<String> records = new ArrayList<>();
        final List<String> commits = new ArrayList<>();
        final List<String> callbacks = Collections.synchronizedList(new ArrayList<>());
        volatile String error = null;

        Member(Run run, String clientId) {
            this.run = run;
            this.clientId = clientId;
            this.thread = new Thread(this::consume, clientId);
        }

        void consume() {
            Properties props = new Properties();
            props.putAll(run.props);
            props.put("group.id", run.group);
            props.put("client.id", clientId);
            props.put("share.acknowledgement.mode", run.explicit ? "explicit" : "implicit");
            try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(
                    props, new StringDeserializer(), new StringDeserializer())) {
                consumer.setAcknowledgementCommitCallback((offsets, exception) -> {
                    for (Map.Entry<TopicIdPartition, Set<Long>> entry : offsets.entrySet()) {
                        callbacks.add("[" + entry.getKey().partition() + "," + entry.getValue().size()
                                + "," + quote(exception == null ? null : exception.toString()) + "]");
                    }
                });
                consumer.subscribe(List.of(run.topic));
                while (!run.stop.get() && !run.late()) {
                    ConsumerRecords<String, String> batch = consumer.poll(Duration.ofMillis(200));
                    if (batch.isEmpty()) {
                        continue;
                    }
                    List<String> done = new ArrayList<>();
                    for (ConsumerRecord<String, String> record : batch) {
                        AcknowledgeType type = run.decide(record);
                        if (run.explicit) {
                            consumer.acknowledge(record, type);
                        }
                        Optional<Short> delivery = record.deliveryCount();
                        records.add("[" + record.partition() + "," + record.offset() + ","
                                + quote(record.value()) + "," + delivery.map(String::valueOf)
                                .orElse("null") + "," + quote(type.toString()) + "]");
                        if (type != AcknowledgeType.RELEASE) {
                            done.add(record.partition() + ":" + record.offset() + ":"
                                    + record.value());
                        }
                    }
                    Map<TopicIdPartition, Optional<KafkaException>> outcome =
                            consumer.commitSync(Duration.ofSeconds(30));
                    for (Map.Entry<TopicIdPartition, Optional<KafkaException>> entry
                            : outcome.entrySet()) {
                        commits.add("[" + entry.getKey().partition() + "," + quote(entry.getValue()
                                .map(Throwable::toString).orElse(null)) + "]");
                    }
                    for (String key : done) {
                        if (key.contains(":" + MARKER)) {
                            run.markersSettled.add(key);
                        } else {
                            run.settled.add(key);
                        }
                    }
                }
            } catch (Exception e) {
                error = e.toString();
            }
        }

        String report() {
            return "{\"client_id\":" + quote(clientId) + ",\"records\":" + join(records)
                    + ",\"commits\":" + join(commits) + ",\"callbacks\":" + join(callbacks)
                    + ",\"error\":" + quote(error) + "}";
        }
    }

    private static String join(Collection<String> items) {
        synchronized (items) {
            return "[" + String.join(",", items) + "]";
        }
    }

    private static String quote(String text) {
        if (text == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
