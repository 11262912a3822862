package kvproxy.connect;

import java.util.Collections;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.sink.SinkConnector;

/** Appends every record it receives to the file named by `file`, one JSON line each. */
public class KvproxySinkConnector extends SinkConnector {
    static final ConfigDef CONFIG = new ConfigDef()
        .define("file", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "the file to append to");

    private Map<String, String> settings;

    @Override public void start(Map<String, String> props) { settings = props; }

    @Override public Class<? extends Task> taskClass() { return KvproxySinkTask.class; }

    @Override public List<Map<String, String>> taskConfigs(int maxTasks) {
        return Collections.singletonList(settings);
    }

    @Override public void stop() { }

    @Override public ConfigDef config() { return CONFIG; }

    @Override public String version() { return "1"; }
}
