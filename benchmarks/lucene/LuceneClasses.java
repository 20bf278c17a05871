// Per-query Lucene timings for benchmarks/bench_bm25_lucene_vocab.py (query classes on a
// generated ~2M-term vocabulary). The index is LuceneBench's (LuceneBench build DOCS INDEX_DIR:
// DOCS_AND_FREQS, forceMerge(1), the line number as doc values "pos"); this program only queries:
//
//   LuceneClasses INDEX_DIR QUERIES_TXT OUT_JSON K1 B K ROUNDS
//       After a JIT warm-up over all queries (at least 5 passes and 5 seconds): ROUNDS timed
//       passes, each query timed alone; OUT_JSON gets every query's fastest pass in ms and
//       OUT_JSON.ids its top-k line numbers. Prints one JSON line (open time, warm-up, passes).
//
// Why per query and best of passes: the ratios are per query class (a class of 50 queries
// against a mixed class), and on a shared 2-core box the fastest pass is the one other
// processes did not preempt, for both engines alike.

import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Locale;

import org.apache.lucene.index.DirectoryReader;
import org.apache.lucene.search.IndexSearcher;
import org.apache.lucene.search.Query;
import org.apache.lucene.search.TopDocs;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.FSDirectory;

public class LuceneClasses {
    public static void main(String[] a) throws Exception {
        Path dir = Paths.get(a[0]);
        List<String[]> qs = LuceneBench.lines(Paths.get(a[1]));
        Path out = Paths.get(a[2]);
        BM25Similarity sim = new BM25Similarity(Float.parseFloat(a[3]), Float.parseFloat(a[4]));
        int k = Integer.parseInt(a[5]);
        int rounds = Integer.parseInt(a[6]);
        long o0 = System.nanoTime();
        try (DirectoryReader reader = DirectoryReader.open(FSDirectory.open(dir))) {
            IndexSearcher s = new IndexSearcher(reader);
            s.setSimilarity(sim);
            s.setQueryCache(null);  // every timed query is really evaluated
            double openS = (System.nanoTime() - o0) / 1e9;
            long[] pos = LuceneLarge.positions(reader.leaves().get(0));
            Query[] q = new Query[qs.size()];
            for (int i = 0; i < q.length; i++) {
                q[i] = LuceneBench.query(qs.get(i));
            }
            long f0 = System.nanoTime();
            s.search(q[0], k);
            double firstMs = (System.nanoTime() - f0) / 1e6;
            long w0 = System.nanoTime();
            for (int rep = 0; rep < 5 || System.nanoTime() - w0 < 5_000_000_000L; rep++) {
                for (Query x : q) {
                    s.search(x, k);
                }
            }
            double warmS = (System.nanoTime() - w0) / 1e9;
            long[] best = new long[q.length];
            java.util.Arrays.fill(best, Long.MAX_VALUE);
            TopDocs[] res = new TopDocs[q.length];
            for (int r = 0; r < rounds; r++) {
                for (int i = 0; i < q.length; i++) {
                    long t1 = System.nanoTime();
                    res[i] = s.search(q[i], k);
                    best[i] = Math.min(best[i], System.nanoTime() - t1);
                }
            }
            try (Writer w = Files.newBufferedWriter(out, StandardCharsets.UTF_8)) {
                w.write("[");
                for (int i = 0; i < q.length; i++) {
                    w.write((i == 0 ? "" : ",") + String.format(Locale.ROOT, "%.5f", best[i] / 1e6));
                }
                w.write("]");
            }
            LuceneLarge.writeIds(Paths.get(out + ".ids"), res, pos);
            System.out.printf(Locale.ROOT, "{\"open_s\": %.5f, \"first_query_ms\": %.3f, \"warmup_s\": %.3f, "
                              + "\"rounds\": %d, \"queries\": %d, \"docs\": %d}%n",
                              openS, firstMs, warmS, rounds, q.length, reader.maxDoc());
        }
    }
}
