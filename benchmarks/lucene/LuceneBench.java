// Lucene row of benchmarks/bench_bm25.py peers: the same pretokenized documents and queries,
// indexed and searched by Lucene itself (the classes inside Anserini's fat jar), so Lucene's
// BM25 query path is timed without Anserini's or pyserini's start-up (both fetch files from
// the network). Run by bench_bm25.py; by hand:
//
//   javac -cp anserini-fatjar.jar -d /tmp/lb benchmarks/lucene/LuceneBench.java
//   java -cp anserini-fatjar.jar:/tmp/lb LuceneBench docs.txt queries.txt ids.json 1.5 0.75 10
//
// The large-corpus rows (bench_bm25.py peers-large) use the resumable modes instead, which keep
// the index on disk between runs:
//
//   java ... LuceneBench build docs.txt INDEX_DIR            # once; prints build_s, index_bytes
//   java ... LuceneBench open INDEX_DIR                      # fresh JVM: DirectoryReader.open + searcher
//   java ... LuceneBench query INDEX_DIR queries.txt ids.json K1 B K THREADS [MASK_PREFIX FRACTIONS]
//
// (LuceneLarge.java). docs.txt / queries.txt: one document / query per line, tokens separated by one space (the
// tokens ragspine's analyzer produced). Prints one JSON line: build and warm-up seconds,
// single-query qps, p50 / p95 ms. ids.json: the top-k document positions of every query.
// Lucene's BM25Similarity keeps k1 and b settable, leaves out the (k1 + 1) numerator (same
// order) and stores document lengths in one byte (SmallFloat), so its ranking is close to,
// not equal to, the exact formula.

import java.io.BufferedReader;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;

import org.apache.lucene.analysis.core.WhitespaceAnalyzer;
import org.apache.lucene.document.Document;
import org.apache.lucene.document.Field;
import org.apache.lucene.document.FieldType;
import org.apache.lucene.document.NumericDocValuesField;
import org.apache.lucene.index.DirectoryReader;
import org.apache.lucene.index.IndexOptions;
import org.apache.lucene.index.IndexWriter;
import org.apache.lucene.index.IndexWriterConfig;
import org.apache.lucene.index.Term;
import org.apache.lucene.search.BooleanClause;
import org.apache.lucene.search.BooleanQuery;
import org.apache.lucene.search.IndexSearcher;
import org.apache.lucene.search.Query;
import org.apache.lucene.search.TermQuery;
import org.apache.lucene.search.TopDocs;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.FSDirectory;

public class LuceneBench {
    static Query query(String[] tokens) {
        BooleanQuery.Builder b = new BooleanQuery.Builder();
        for (String t : tokens) {  // a repeated token is a repeated clause: its score counts twice
            b.add(new TermQuery(new Term("body", t)), BooleanClause.Occur.SHOULD);
        }
        return b.build();
    }

    static List<String[]> lines(Path p) throws IOException {
        List<String[]> out = new ArrayList<>();
        try (BufferedReader r = Files.newBufferedReader(p, StandardCharsets.UTF_8)) {
            String line;
            while ((line = r.readLine()) != null) {
                out.add(line.isEmpty() ? new String[0] : line.split(" "));
            }
        }
        return out;
    }

    /** Index one document per line of docsPath into dir (created), the way every row builds it:
     *  DOCS_AND_FREQS postings (no positions), the line number as doc values "pos", one segment. */
    static void index(Path docsPath, Path dir, BM25Similarity sim) throws IOException {
        IndexWriterConfig cfg = new IndexWriterConfig(new WhitespaceAnalyzer());
        cfg.setSimilarity(sim);
        cfg.setRAMBufferSizeMB(256);
        cfg.setOpenMode(IndexWriterConfig.OpenMode.CREATE);
        FieldType ft = new FieldType();
        ft.setIndexOptions(IndexOptions.DOCS_AND_FREQS);
        ft.setTokenized(true);
        ft.freeze();
        try (FSDirectory d = FSDirectory.open(dir); IndexWriter w = new IndexWriter(d, cfg);
             BufferedReader r = Files.newBufferedReader(docsPath, StandardCharsets.UTF_8)) {
            String line;
            long pos = 0;
            while ((line = r.readLine()) != null) {
                Document doc = new Document();
                doc.add(new Field("body", line, ft));
                doc.add(new NumericDocValuesField("pos", pos++));
                w.addDocument(doc);
            }
            w.forceMerge(1);  // one segment: the searched index is in its best shape
            w.commit();
        }
    }

    static void deleteTree(Path dir) throws IOException {
        try (var walk = Files.walk(dir)) {
            for (Path p : walk.sorted(Comparator.reverseOrder()).toList()) {
                Files.deleteIfExists(p);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length > 0 && (args[0].equals("build") || args[0].equals("open") || args[0].equals("query"))) {
            LuceneLarge.main(args);
            return;
        }
        Path docsPath = Paths.get(args[0]);
        Path queriesPath = Paths.get(args[1]);
        Path idsPath = Paths.get(args[2]);
        float k1 = Float.parseFloat(args[3]);
        float b = Float.parseFloat(args[4]);
        int k = Integer.parseInt(args[5]);
        BM25Similarity sim = new BM25Similarity(k1, b);
        Path dir = Files.createTempDirectory("lucene_bench");
        try {
            long t0 = System.nanoTime();
            index(docsPath, dir, sim);
            double buildS = (System.nanoTime() - t0) / 1e9;
            List<String[]> qs = lines(queriesPath);
            try (DirectoryReader reader = DirectoryReader.open(FSDirectory.open(dir))) {
                IndexSearcher s = new IndexSearcher(reader);
                s.setSimilarity(sim);
                s.setQueryCache(null);  // every timed query is really evaluated
                long w0 = System.nanoTime();
                // JIT warm-up over the whole query set: at least 5 rounds and 5 seconds.
                for (int rep = 0; rep < 5 || System.nanoTime() - w0 < 5_000_000_000L; rep++) {
                    for (String[] q : qs) {
                        s.search(query(q), k);
                    }
                }
                double warmS = (System.nanoTime() - w0) / 1e9;
                long[] lat = new long[qs.size()];
                TopDocs[] res = new TopDocs[qs.size()];
                long all0 = System.nanoTime();
                for (int i = 0; i < qs.size(); i++) {
                    long t1 = System.nanoTime();
                    res[i] = s.search(query(qs.get(i)), k);
                    lat[i] = System.nanoTime() - t1;
                }
                double total = (System.nanoTime() - all0) / 1e9;
                LuceneLarge.writeIds(idsPath, res, LuceneLarge.positions(reader.leaves().get(0)));
                long[] sorted = Arrays.copyOf(lat, lat.length);
                Arrays.sort(sorted);
                double p50 = sorted[sorted.length / 2] / 1e6;
                double p95 = LuceneLarge.percentile(lat, 0.95);
                System.out.printf("{\"build_s\": %.4f, \"warmup_s\": %.4f, \"qps\": %.2f, \"p50_ms\": %.4f, "
                                  + "\"p95_ms\": %.4f, \"queries\": %d, \"docs\": %d}%n",
                                  buildS, warmS, qs.size() / total, p50, p95, qs.size(), reader.maxDoc());
            }
        } finally {
            deleteTree(dir);
        }
    }
}
