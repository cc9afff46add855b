import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.retry.RetryNTimes;

/**
 * CuratorLeaderLatch <connect> <path> <id>: a started new LeaderLatch(client, path, id), driven by
 * lines on stdin. "await <ms>" waits at most ms for leadership and answers "LEADER" or "TIMEOUT";
 * "leader" answers "LEADER_IS <id>" with the id of the participant Curator sees as leader (empty
 * when there is none); "close" closes the latch (leaving the election) and answers "CLOSED"; a
 * failure answers "ERROR <exception>"; "quit" (or the end of stdin) closes the client.
 */
public class CuratorLeaderLatch {
    static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1], id = args[2];
        CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryNTimes(3, 100));
        client.start();
        if (!client.blockUntilConnected(15, TimeUnit.SECONDS)) {
            say("NOCONNECT");
            System.exit(2);
        }
        LeaderLatch latch = new LeaderLatch(client, path, id);
        latch.start();
        say("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null && !line.equals("quit"); ) {
            String[] words = line.trim().split(" ");
            try {
                switch (words[0]) {
                    case "await":
                        say(latch.await(Long.parseLong(words[1]), TimeUnit.MILLISECONDS) ? "LEADER" : "TIMEOUT");
                        break;
                    case "leader":
                        Participant leader = latch.getLeader();
                        say("LEADER_IS " + (leader.isLeader() ? leader.getId() : ""));
                        break;
                    case "close":
                        latch.close();
                        say("CLOSED");
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
