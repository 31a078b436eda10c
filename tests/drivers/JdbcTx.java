// pgjdbc through a transaction-mode pgfresh, and through a session-mode one
// (tests/tests/tx_drivers.rs).
//
// Usage: java -cp /usr/share/java/postgresql.jar JdbcTx.java HOST PORT USER PASSWORD DBNAME TABLE [session]
// (a single-file source program: `java` compiles it, which needs a JDK, not only a JRE)
//
// Six connections with prepareThreshold=1 (every PreparedStatement is a named server
// statement, S_1, S_2, ... on each connection: the same names with other texts on the
// other clients) run ROUNDS rounds of: a prepared INSERT, a prepared SELECT of the row
// just inserted, a statement whose text differs per client, a transaction of two
// statements (pgjdbc sends BEGIN in the same batch as the first statement), a batch
// insert (addBatch/executeBatch: one Sync for all) and a read-only transaction
// (setReadOnly(true), setAutoCommit(false): BEGIN READ ONLY) that must see the batch,
// and a read-only transaction that fails and is rolled back (pgjdbc's ROLLBACK is a
// named statement too from its second use, run in the failed transaction, on a standby).
// Odd clients have no statement cache (preparedStatementCacheQueries=0): closing a
// PreparedStatement sends Close, and the next one is parsed under a new name. At the end
// each client looks at the server connection it runs on from inside a transaction: its
// statements are there under pgfresh's names (__pgfresh_N), pgjdbc's own (S_N) are not
// (transaction mode; with `session` the server holds pgjdbc's own names).
//
// With PGFRESH_TEST_TLS=1 in the environment it connects with sslmode=require.
//
// Prints "OK <checks>" and exits 0 when every check passed.

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

public class JdbcTx {
    static final int CLIENTS = 6;
    static final int ROUNDS = 30;
    // Every wait is bounded: a hang in the proxy fails the program instead of blocking it.
    static final int TIMEOUT_S = 60;

    static String url;
    static String user;
    static String password;
    static String table;
    static boolean session;

    static Connection connect(int cid) throws SQLException {
        Properties p = new Properties();
        p.setProperty("user", user);
        p.setProperty("password", password);
        p.setProperty("prepareThreshold", "1");
        p.setProperty("connectTimeout", "10");
        p.setProperty("socketTimeout", String.valueOf(TIMEOUT_S));
        // PGFRESH_TEST_TLS=1: TLS without certificate checks.
        if ("1".equals(System.getenv("PGFRESH_TEST_TLS"))) {
            p.setProperty("sslmode", "require");
        }
        if (cid % 2 == 1) {
            p.setProperty("preparedStatementCacheQueries", "0");
        }
        return DriverManager.getConnection(url, p);
    }

    static void check(boolean cond, String what) {
        if (!cond) {
            throw new AssertionError(what);
        }
    }

    static String one(PreparedStatement st) throws SQLException {
        try (ResultSet rs = st.executeQuery()) {
            if (!rs.next()) {
                return null;
            }
            String v = rs.getString(1);
            check(!rs.next(), "more than one row");
            return v;
        }
    }

    static int client(int cid, CyclicBarrier barrier) throws Exception {
        int checks = 0;
        String insertSql = "INSERT INTO " + table + " (client, n, v) VALUES (?, ?, ?)";
        try (Connection c = connect(cid);
                PreparedStatement insert = c.prepareStatement(insertSql);
                PreparedStatement select =
                        c.prepareStatement("SELECT v FROM " + table + " WHERE client = ? AND n = ?");
                PreparedStatement update =
                        c.prepareStatement("UPDATE " + table + " SET v = ? WHERE client = ? AND n = ?");
                PreparedStatement range = c.prepareStatement(
                        "SELECT count(*) FROM " + table + " WHERE client = ? AND n BETWEEN ? AND ?")) {
            // Every client connected before any starts: all six compete for the pool.
            barrier.await(TIMEOUT_S, TimeUnit.SECONDS);
            for (int n = 0; n < ROUNDS; n++) {
                insert.setInt(1, cid);
                insert.setInt(2, n);
                insert.setString(3, "c" + cid + "n" + n);
                check(insert.executeUpdate() == 1, "client " + cid + ": INSERT " + n);
                select.setInt(1, cid);
                select.setInt(2, n);
                String v = one(select);
                check(("c" + cid + "n" + n).equals(v), "client " + cid + " read " + v + " after inserting " + n);
                // A new statement every round: without a statement cache, closing it
                // sends Close and the next one gets a new name.
                try (PreparedStatement own = c.prepareStatement("SELECT ?::int + " + cid)) {
                    own.setInt(1, n);
                    String sum = one(own);
                    check(String.valueOf(n + cid).equals(sum),
                            "client " + cid + " got " + sum + " for " + n + " + " + cid + ": another text ran");
                }
                // A transaction: BEGIN goes out with the first statement.
                c.setAutoCommit(false);
                insert.setInt(1, cid);
                insert.setInt(2, 1000 + n);
                insert.setString(3, "pending");
                insert.executeUpdate();
                update.setString(1, "tx" + n);
                update.setInt(2, cid);
                update.setInt(3, 1000 + n);
                check(update.executeUpdate() == 1, "client " + cid + ": UPDATE in transaction " + n);
                c.commit();
                c.setAutoCommit(true);
                select.setInt(2, 1000 + n);
                v = one(select);
                check(("tx" + n).equals(v), "client " + cid + " read " + v + " after its transaction " + n);
                // A batch: Bind/Execute for each row, one Sync.
                int first = 2000 + 3 * n;
                for (int k = 0; k < 3; k++) {
                    insert.setInt(1, cid);
                    insert.setInt(2, first + k);
                    insert.setString(3, "batch");
                    insert.addBatch();
                }
                int[] counts = insert.executeBatch();
                check(counts.length == 3, "client " + cid + ": batch counts " + counts.length);
                for (int k : counts) {
                    check(k == 1 || k == Statement.SUCCESS_NO_INFO, "client " + cid + ": batch count " + k);
                }
                // A read-only transaction (BEGIN READ ONLY) sees the batch.
                c.setReadOnly(true);
                c.setAutoCommit(false);
                range.setInt(1, cid);
                range.setInt(2, first);
                range.setInt(3, first + 2);
                String seen = one(range);
                check("3".equals(seen), "client " + cid + ": read-only transaction saw " + seen + " of 3 batch rows");
                try (PreparedStatement ro = c.prepareStatement("SELECT current_setting('transaction_read_only')")) {
                    String mode = one(ro);
                    check("on".equals(mode), "client " + cid + ": transaction_read_only = " + mode);
                }
                c.commit();
                // A read-only transaction that fails: rollback() ends it.
                check("3".equals(one(range)), "client " + cid + ": read-only transaction before its error");
                try (PreparedStatement bad = c.prepareStatement("SELECT v FROM " + table + "_missing")) {
                    bad.executeQuery().close();
                    check(false, "client " + cid + ": a query of a missing table ran");
                } catch (SQLException e) {
                    check("42P01".equals(e.getSQLState()), "client " + cid + ": missing table gave " + e.getSQLState());
                }
                c.rollback();
                c.setAutoCommit(true);
                c.setReadOnly(false);
                checks += 7;
            }
            range.setInt(1, cid);
            range.setInt(2, 0);
            range.setInt(3, 4999);
            String count = one(range);
            check(String.valueOf(5 * ROUNDS).equals(count), "client " + cid + " sees " + count + " rows of its own");
            checks += 1;
            // The server connection this transaction runs on.
            c.setAutoCommit(false);
            insert.setInt(1, cid);
            insert.setInt(2, 5000);
            insert.setString(3, "last");
            insert.executeUpdate();
            List<String> names = new ArrayList<>();
            boolean mapped = false;
            try (PreparedStatement ps =
                            c.prepareStatement("SELECT name, statement FROM pg_prepared_statements ORDER BY name");
                    ResultSet rs = ps.executeQuery()) {
                while (rs.next()) {
                    String name = rs.getString(1);
                    names.add(name);
                    if (name.startsWith("__pgfresh_") && rs.getString(2).startsWith("INSERT INTO " + table + " ")) {
                        mapped = true;
                    }
                }
            }
            c.commit();
            c.setAutoCommit(true);
            if (session) {
                return checks;
            }
            check(mapped, "client " + cid + ": the INSERT is not prepared on the server under pgfresh's names: " + names);
            for (String name : names) {
                check(!name.startsWith("S_"), "client " + cid + ": pgjdbc's own names reached the server: " + names);
            }
            checks += 2;
        }
        return checks;
    }

    public static void main(String[] args) throws Exception {
        String host = args[0];
        String port = args[1];
        user = args[2];
        password = args[3];
        String db = args[4];
        table = args[5];
        session = args.length > 6 && "session".equals(args[6]);
        url = "jdbc:postgresql://" + host + ":" + port + "/" + db;
        try (Connection setup = connect(0); Statement st = setup.createStatement()) {
            st.execute("CREATE TABLE IF NOT EXISTS " + table
                    + " (client int, n int, v text, PRIMARY KEY (client, n))");
        }
        CyclicBarrier barrier = new CyclicBarrier(CLIENTS);
        ExecutorService pool = Executors.newFixedThreadPool(CLIENTS);
        List<Future<Integer>> results = new ArrayList<>();
        for (int cid = 0; cid < CLIENTS; cid++) {
            final int id = cid;
            results.add(pool.submit(() -> client(id, barrier)));
        }
        int checks = 0;
        boolean failed = false;
        for (int cid = 0; cid < CLIENTS; cid++) {
            try {
                checks += results.get(cid).get(2 * TIMEOUT_S, TimeUnit.SECONDS);
            } catch (ExecutionException e) {
                failed = true;
                System.err.println("client " + cid + ":");
                e.getCause().printStackTrace();
            } catch (Exception e) {
                failed = true;
                System.err.println("client " + cid + ": " + e);
            }
        }
        // Exit even with a client still stuck in a read.
        if (failed) {
            System.exit(1);
        }
        System.out.println("OK " + checks);
        System.exit(0);
    }
}
