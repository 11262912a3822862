package kvproxy.connect;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.source.SourceTask;
import org.apache.kafka.connect.source.TransactionContext;

/** All records not yet committed in one poll (one transaction with the default boundary). */
public class KvproxySourceTask extends SourceTask {
    private static final Map<String, String> PARTITION = Collections.singletonMap("source", "kvproxy");

    private String topic;
    private String[] lines;
    private int next;

    @Override public String version() { return "1"; }

    @Override public void start(Map<String, String> props) {
        topic = props.get("topic");
        String records = props.getOrDefault("records", "");
        lines = records.isEmpty() ? new String[0] : records.split("\n");
        Map<String, Object> stored = context.offsetStorageReader().offset(PARTITION);
        next = stored == null ? 0 : ((Number) stored.get("next")).intValue();
    }

    @Override public List<SourceRecord> poll() throws InterruptedException {
        if (next >= lines.length) {
            Thread.sleep(100);  // nothing more to send: do not spin
            return null;
        }
        List<SourceRecord> batch = new ArrayList<>();
        for (; next < lines.length; next++) {
            String[] fields = lines[next].split("\t", -1);
            Integer partition = fields.length > 2 ? Integer.valueOf(fields[2]) : null;
            Map<String, Integer> offset = Collections.singletonMap("next", next + 1);
            batch.add(new SourceRecord(PARTITION, offset, topic, partition,
                Schema.STRING_SCHEMA, fields[0], Schema.STRING_SCHEMA, fields[1]));
        }
        TransactionContext transaction = context.transactionContext();
        if (transaction != null) {  // transaction.boundary=connector
            transaction.commitTransaction(batch.get(batch.size() - 1));
        }
        return batch;
    }

    @Override public void stop() { }
}
