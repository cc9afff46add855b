import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryNTimes;

/**
 * CuratorRwLock <connect> <path>: holders of new InterProcessReadWriteLock(client, path), driven
 * by lines on stdin. "<holder> read <ms>" or "<holder> write <ms>" takes that side, waiting at
 * most ms, and answers "<holder> ACQUIRED" or "<holder> TIMEOUT"; "<holder> release" answers
 * "<holder> RELEASED"; a failure answers "<holder> ERROR <exception>"; "quit" (or the end of
 * stdin) closes the client. Each holder has a lock object and a thread of its own: Curator's
 * locks re-enter per object and thread, and only the thread that took one may release it.
 */
public class CuratorRwLock {
    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static class Holder {
        final String name;
        final InterProcessReadWriteLock lock;
        final ExecutorService thread = Executors.newSingleThreadExecutor();
        InterProcessMutex held;

        Holder(String name, InterProcessReadWriteLock lock) {
            this.name = name;
            this.lock = lock;
        }

        void run(String verb, String arg) {
            try {
                if (verb.equals("release")) {
                    held.release();
                    held = null;
                    say(name + " RELEASED");
                    return;
                }
                InterProcessMutex side = verb.equals("read") ? lock.readLock() : lock.writeLock();
                boolean got = side.acquire(Long.parseLong(arg), TimeUnit.MILLISECONDS);
                if (got) held = side;
                say(name + (got ? " ACQUIRED" : " TIMEOUT"));
            } catch (Exception e) {
                say(name + " ERROR " + e);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1];
        CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryNTimes(3, 100));
        client.start();
        if (!client.blockUntilConnected(15, TimeUnit.SECONDS)) {
            say("NOCONNECT");
            System.exit(2);
        }
        say("READY");
        Map<String, Holder> holders = new HashMap<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null && !line.equals("quit"); ) {
            String[] words = line.trim().split(" ");
            Holder holder = holders.computeIfAbsent(words[0], name -> new Holder(name, new InterProcessReadWriteLock(client, path)));
            String arg = words.length > 2 ? words[2] : "";
            holder.thread.submit(() -> holder.run(words[1], arg));
        }
        for (Holder holder : holders.values()) {
            holder.thread.shutdown();
            holder.thread.awaitTermination(30, TimeUnit.SECONDS);
        }
        client.close();
    }
}
