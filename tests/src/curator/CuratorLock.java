import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

/** CuratorLock <connect> <path> hold|try <ms>: hold the mutex for ms, or try for ms. */
public class CuratorLock {
    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1], mode = args[2];
        long ms = Long.parseLong(args[3]);
        CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryNTimes(3, 100));
        client.start();
        if (!client.blockUntilConnected(15, TimeUnit.SECONDS)) {
            System.out.println("NOCONNECT");
            System.exit(2);
        }
        InterProcessMutex mutex = new InterProcessMutex(client, path);
        boolean got;
        if (mode.equals("hold")) { mutex.acquire(); got = true; }
        else { got = mutex.acquire(ms, TimeUnit.MILLISECONDS); }
        System.out.println(got ? "ACQUIRED" : "TIMEOUT");
        System.out.flush();
        if (got) {
            if (mode.equals("hold")) Thread.sleep(ms);
            mutex.release();
            System.out.println("RELEASED");
            System.out.flush();
        }
        client.close();
    }
}
