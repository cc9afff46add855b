import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.barriers.DistributedDoubleBarrier;
import org.apache.curator.retry.RetryNTimes;

/**
 * CuratorDoubleBarrier <connect> <path> <parties>: one member of a new DistributedDoubleBarrier(client,
 * path, parties), driven by lines on stdin. "enter <ms>" enters, waiting at most ms, and answers
 * "ENTERED" or "TIMEOUT"; "leave <ms>" leaves, waiting at most ms for the others, and answers "LEFT"
 * or "TIMEOUT"; a failure answers "ERROR <exception>"; "quit" (or the end of stdin) closes the client
 * (ending its session, so a member that did not leave is counted out).
 */
public class CuratorDoubleBarrier {
    static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1];
        int parties = Integer.parseInt(args[2]);
        CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryNTimes(3, 100));
        client.start();
        if (!client.blockUntilConnected(15, TimeUnit.SECONDS)) {
            say("NOCONNECT");
            System.exit(2);
        }
        DistributedDoubleBarrier barrier = new DistributedDoubleBarrier(client, path, parties);
        say("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null && !line.equals("quit"); ) {
            String[] words = line.trim().split(" ");
            try {
                switch (words[0]) {
                    case "enter":
                        say(barrier.enter(Long.parseLong(words[1]), TimeUnit.MILLISECONDS) ? "ENTERED" : "TIMEOUT");
                        break;
                    case "leave":
                        say(barrier.leave(Long.parseLong(words[1]), TimeUnit.MILLISECONDS) ? "LEFT" : "TIMEOUT");
                        break;
                    default:
                        say("ERROR unknown command " + line);
                }
            } catch (Exception e) {
                say("ERROR " + e);
            }
        }
        client.close();
    }
}
