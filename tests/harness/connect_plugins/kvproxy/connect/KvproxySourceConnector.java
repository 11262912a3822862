package kvproxy.connect;

import java.util.Collections;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.source.ConnectorTransactionBoundaries;
import org.apache.kafka.connect.source.ExactlyOnceSupport;
import org.apache.kafka.connect.source.SourceConnector;

/**
 * Emits the records of its `records` setting (one per line: key TAB value [TAB partition]) to
 * `topic`, once: the source offset is the index of the next record. Declares exactly-once
 * support (KIP-618), so a worker with `exactly.once.source.support=enabled` runs it with
 * `exactly.once.support=required`; with `transaction.boundary=connector` the task commits a
 * transaction after each poll's last record.
 */
public class KvproxySourceConnector extends SourceConnector {
    static final ConfigDef CONFIG = new ConfigDef()
        .define("topic", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "where the records go")
        .define("records", ConfigDef.Type.STRING, "", ConfigDef.Importance.HIGH,
                "one record per line: key TAB value, optionally TAB partition");

    private Map<String, String> settings;

    @Override public void start(Map<String, String> props) { settings = props; }

    @Override public Class<? extends Task> taskClass() { return KvproxySourceTask.class; }

    @Override public List<Map<String, String>> taskConfigs(int maxTasks) {
        return Collections.singletonList(settings);
    }

    @Override public void stop() { }

    @Override public ConfigDef config() { return CONFIG; }

    @Override public String version() { return "1"; }

    @Override public ExactlyOnceSupport exactlyOnceSupport(Map<String, String> props) {
        return ExactlyOnceSupport.SUPPORTED;
    }

    @Override public ConnectorTransactionBoundaries canDefineTransactionBoundaries(
            Map<String, String> props) {
        return ConnectorTransactionBoundaries.SUPPORTED;
    }
}
