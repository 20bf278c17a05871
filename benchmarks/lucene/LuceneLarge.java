// Large-corpus Lucene rows of benchmarks/bench_bm25.py peers-large: the index is built once into
// a folder that survives between runs, and opening and querying are timed in separate JVMs, so a
// 10M-document run can stop after any step and resume. Called through LuceneBench's main:
//
//   LuceneBench build DOCS_TXT INDEX_DIR
//       Index DOCS_TXT (one document per line, tokens separated by one space) exactly as the
//       small-set rows do (LuceneBench.index: DOCS_AND_FREQS, forceMerge(1)) into INDEX_DIR.tmp,
//       then rename it to INDEX_DIR: a folder named INDEX_DIR is always a complete index.
//   LuceneBench open INDEX_DIR
//       DirectoryReader.open + the first IndexSearcher in this fresh JVM, timed (the JVM's own start
//       is not), and the index's bytes on disk.
//   LuceneBench query INDEX_DIR QUERIES_TXT IDS_JSON K1 B K THREADS [MASK_PREFIX FRACTIONS]
//       After a JIT warm-up over all queries: single-query latency (ROUNDS passes), then all
//       queries spread over THREADS threads sharing one IndexSearcher (Lucene's own way to use
//       several cores for many queries; with one segment, intra-query slicing has nothing to split),
//       then, per filter fraction, filtered and unfiltered queries alternating in one loop. A filter
//       is MASK_PREFIX<fraction>.bits (numpy packbits, little bit order, by document line number),
//       applied as a FILTER clause over a bitset, so the kept documents equal ragspine's; Lucene
//       keeps the whole corpus's statistics (N, df, avgdl), not the survivors'.
//
// Prints one JSON line; IDS_JSON gets the top-k line numbers of every query (and IDS_JSON.<fraction>
// those of the filtered queries).

import java.io.IOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.stream.Stream;

import org.apache.lucene.index.DirectoryReader;
import org.apache.lucene.index.LeafReaderContext;
import org.apache.lucene.index.NumericDocValues;
import org.apache.lucene.search.BooleanClause;
import org.apache.lucene.search.BooleanQuery;
import org.apache.lucene.search.ConstantScoreScorer;
import org.apache.lucene.search.ConstantScoreWeight;
import org.apache.lucene.search.IndexSearcher;
import org.apache.lucene.search.Query;
import org.apache.lucene.search.QueryVisitor;
import org.apache.lucene.search.ScoreDoc;
import org.apache.lucene.search.ScoreMode;
import org.apache.lucene.search.Scorer;
import org.apache.lucene.search.TopDocs;
import org.apache.lucene.search.Weight;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.FSDirectory;
import org.apache.lucene.util.BitSetIterator;
import org.apache.lucene.util.FixedBitSet;

public class LuceneLarge {
    private static final int ROUNDS = 3;

    /** The documents a filter keeps, as a query matching exactly the set bits (one segment). */
    static final class BitSetQuery extends Query {
        private final FixedBitSet bits;
        private final long cardinality;
        private final String name;

        BitSetQuery(FixedBitSet bits, String name) {
            this.bits = bits;
            this.cardinality = bits.cardinality();
            this.name = name;
        }

        @Override
        public Weight createWeight(IndexSearcher searcher, ScoreMode scoreMode, float boost) {
            return new ConstantScoreWeight(this, boost) {
                @Override
                public Scorer scorer(LeafReaderContext ctx) {
                    return new ConstantScoreScorer(this, score(), scoreMode, new BitSetIterator(bits, cardinality));
                }

                @Override
                public boolean isCacheable(LeafReaderContext ctx) {
                    return false;
                }
            };
        }

        @Override
        public String toString(String field) {
            return "bits:" + name;
        }

        @Override
        public void visit(QueryVisitor visitor) {
            visitor.visitLeaf(this);
        }

        @Override
        public boolean equals(Object other) {
            return this == other;
        }

        @Override
        public int hashCode() {
            return System.identityHashCode(this);
        }
    }

    static long bytesOnDisk(Path dir) throws IOException {
        try (Stream<Path> files = Files.list(dir)) {
            long total = 0;
            for (Path p : files.toList()) {
                total += Files.size(p);
            }
            return total;
        }
    }

    static void build(Path docs, Path dir) throws IOException {
        Path tmp = dir.resolveSibling(dir.getFileName() + ".tmp");
        if (Files.exists(tmp)) {
            LuceneBench.deleteTree(tmp);
        }
        long t0 = System.nanoTime();
        LuceneBench.index(docs, tmp, new BM25Similarity());  // norms do not depend on k1 or b
        double buildS = (System.nanoTime() - t0) / 1e9;
        Files.move(tmp, dir);
        try (DirectoryReader r = DirectoryReader.open(FSDirectory.open(dir))) {
            System.out.printf(Locale.ROOT, "{\"build_s\": %.4f, \"index_bytes\": %d, \"docs\": %d, \"segments\": %d}%n",
                              buildS, bytesOnDisk(dir), r.maxDoc(), r.leaves().size());
        }
    }

    static void open(Path dir) throws IOException {
        long t0 = System.nanoTime();
        try (DirectoryReader r = DirectoryReader.open(FSDirectory.open(dir))) {
            IndexSearcher s = new IndexSearcher(r);
            double openS = (System.nanoTime() - t0) / 1e9;
            System.out.printf(Locale.ROOT, "{\"open_s\": %.5f, \"index_bytes\": %d, \"docs\": %d}%n",
                              openS, bytesOnDisk(dir), s.getIndexReader().maxDoc());
        }
    }

    /** Line number (the "pos" doc values) of every Lucene doc id of the one segment. */
    static long[] positions(LeafReaderContext leaf) throws IOException {
        long[] pos = new long[leaf.reader().maxDoc()];
        NumericDocValues dv = leaf.reader().getNumericDocValues("pos");
        for (int d = dv.nextDoc(); d != NumericDocValues.NO_MORE_DOCS; d = dv.nextDoc()) {
            pos[d] = dv.longValue();
        }
        return pos;
    }

    static FixedBitSet mask(Path bitsFile, long[] pos) throws IOException {
        byte[] packed = Files.readAllBytes(bitsFile);
        FixedBitSet bits = new FixedBitSet(pos.length);
        for (int d = 0; d < pos.length; d++) {
            long p = pos[d];
            if (((packed[(int) (p >>> 3)] >>> (p & 7)) & 1) != 0) {
                bits.set(d);
            }
        }
        return bits;
    }

    static double percentile(long[] ns, double q) {
        long[] s = Arrays.copyOf(ns, ns.length);
        Arrays.sort(s);
        return s[Math.min(s.length - 1, Math.max(0, (int) Math.ceil(q * s.length) - 1))] / 1e6;
    }

    static void writeIds(Path path, TopDocs[] res, long[] pos) throws IOException {
        try (Writer out = Files.newBufferedWriter(path, StandardCharsets.UTF_8)) {
            out.write("[");
            for (int i = 0; i < res.length; i++) {
                out.write(i == 0 ? "[" : ",[");
                ScoreDoc[] sd = res[i].scoreDocs;
                for (int j = 0; j < sd.length; j++) {
                    out.write((j == 0 ? "" : ",") + pos[sd[j].doc]);
                }
                out.write("]");
            }
            out.write("]");
        }
    }

    static void query(String[] a) throws Exception {
        Path dir = Paths.get(a[1]);
        List<String[]> qs = LuceneBench.lines(Paths.get(a[2]));
        Path idsPath = Paths.get(a[3]);
        BM25Similarity sim = new BM25Similarity(Float.parseFloat(a[4]), Float.parseFloat(a[5]));
        int k = Integer.parseInt(a[6]);
        int threads = Integer.parseInt(a[7]);
        long o0 = System.nanoTime();
        try (DirectoryReader reader = DirectoryReader.open(FSDirectory.open(dir))) {
            IndexSearcher s = new IndexSearcher(reader);
            double openS = (System.nanoTime() - o0) / 1e9;
            s.setSimilarity(sim);
            s.setQueryCache(null);  // every timed query is really evaluated
            if (reader.leaves().size() != 1) {
                throw new IllegalStateException("expected one segment after forceMerge(1), found " + reader.leaves().size());
            }
            long[] pos = positions(reader.leaves().get(0));
            Query[] q = new Query[qs.size()];
            for (int i = 0; i < q.length; i++) {
                q[i] = LuceneBench.query(qs.get(i));
            }
            long w0 = System.nanoTime();
            for (int rep = 0; rep < 5 || System.nanoTime() - w0 < 5_000_000_000L; rep++) {  // JIT warm-up
                for (Query x : q) {
                    s.search(x, k);
                }
            }
            double warmS = (System.nanoTime() - w0) / 1e9;
            long[] lat = new long[q.length * ROUNDS];
            double[] roundQps = new double[ROUNDS];
            TopDocs[] res = new TopDocs[q.length];
            for (int r = 0; r < ROUNDS; r++) {
                long all0 = System.nanoTime();
                for (int i = 0; i < q.length; i++) {
                    long t1 = System.nanoTime();
                    res[i] = s.search(q[i], k);
                    lat[r * q.length + i] = System.nanoTime() - t1;
                }
                roundQps[r] = q.length / ((System.nanoTime() - all0) / 1e9);
            }
            writeIds(idsPath, res, pos);
            Arrays.sort(roundQps);
            double batchQps = batch(s, q, k, threads);
            StringBuilder filtered = new StringBuilder();
            if (a.length > 9) {
                for (String frac : a[9].split(",")) {
                    FixedBitSet bits = mask(Paths.get(a[8] + frac + ".bits"), pos);
                    filtered.append(filtered.length() == 0 ? "" : ", ")
                            .append(interleaved(s, q, k, bits, frac, Paths.get(idsPath + "." + frac), pos));
                }
            }
            double bestSum = 0;  // each query's fastest pass (see bench_bm25._best_of_rounds)
            for (int i = 0; i < q.length; i++) {
                long best = Long.MAX_VALUE;
                for (int r = 0; r < ROUNDS; r++) {
                    best = Math.min(best, lat[r * q.length + i]);
                }
                bestSum += best / 1e9;
            }
            System.out.printf(Locale.ROOT, "{\"open_s\": %.5f, \"warmup_s\": %.4f, \"qps\": %.2f, \"p50_ms\": %.4f, "
                              + "\"p95_ms\": %.4f, \"qps_best_of_rounds\": %.2f, \"batch_qps\": %.2f, "
                              + "\"batch_threads\": %d, \"queries\": %d, \"docs\": %d, \"filtered\": {%s}}%n",
                              openS, warmS, roundQps[ROUNDS / 2], percentile(lat, 0.5), percentile(lat, 0.95),
                              q.length / bestSum, batchQps, threads, q.length, reader.maxDoc(), filtered);
        }
    }

    /** All queries over `threads` threads sharing the searcher; the median of ROUNDS passes, in qps. */
    static double batch(IndexSearcher s, Query[] q, int k, int threads) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        try {
            double[] qps = new double[ROUNDS];
            for (int r = -1; r < ROUNDS; r++) {  // r = -1: warm-up pass of the pool
                long t0 = System.nanoTime();
                List<Future<?>> parts = new ArrayList<>();
                for (int t = 0; t < threads; t++) {
                    final int first = t;
                    parts.add(pool.submit(() -> {
                        for (int i = first; i < q.length; i += threads) {
                            s.search(q[i], k);
                        }
                        return null;
                    }));
                }
                for (Future<?> f : parts) {
                    f.get();
                }
                if (r >= 0) {
                    qps[r] = q.length / ((System.nanoTime() - t0) / 1e9);
                }
            }
            Arrays.sort(qps);
            return qps[ROUNDS / 2];
        } finally {
            pool.shutdown();
        }
    }

    /** Filtered and unfiltered queries alternating in one loop (after one warm-up pass of each). */
    static String interleaved(IndexSearcher s, Query[] q, int k, FixedBitSet bits, String frac, Path ids, long[] pos)
            throws IOException {
        BitSetQuery filter = new BitSetQuery(bits, frac);
        Query[] fq = new Query[q.length];
        for (int i = 0; i < q.length; i++) {
            fq[i] = new BooleanQuery.Builder().add(q[i], BooleanClause.Occur.MUST)
                    .add(filter, BooleanClause.Occur.FILTER).build();
        }
        TopDocs[] res = new TopDocs[q.length];
        for (int i = 0; i < q.length; i++) {
            s.search(q[i], k);
            res[i] = s.search(fq[i], k);
        }
        long[] f = new long[q.length * ROUNDS];
        long[] u = new long[q.length * ROUNDS];
        for (int r = 0; r < ROUNDS; r++) {
            for (int i = 0; i < q.length; i++) {
                long t0 = System.nanoTime();
                s.search(q[i], k);
                long t1 = System.nanoTime();
                s.search(fq[i], k);
                long t2 = System.nanoTime();
                u[r * q.length + i] = t1 - t0;
                f[r * q.length + i] = t2 - t1;
            }
        }
        writeIds(ids, res, pos);
        return String.format(Locale.ROOT, "\"%s\": {\"p50_ms\": %.4f, \"unfiltered_p50_ms\": %.4f, \"survivors\": %d}",
                             frac, percentile(f, 0.5), percentile(u, 0.5), bits.cardinality());
    }

    public static void main(String[] a) throws Exception {
        switch (a[0]) {
            case "build" -> build(Paths.get(a[1]), Paths.get(a[2]));
            case "open" -> open(Paths.get(a[1]));
            case "query" -> query(a);
            default -> throw new IllegalArgumentException("unknown mode " + a[0]);
        }
    }
}
