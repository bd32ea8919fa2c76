"""IMDB as an offgnn typed dataset, for the typed benchmarks: the tables of
the graphdatascience 2.2 wheel (GTN's IMDB: 4,661 movies, 2,270 directors,
5,841 actors, 1,256-d bag-of-keywords rows; actor:acted_in:movie,
director:directed_in:movie), the two movie tables as one (a movie without a
genre has a null label, so it is in no split), imported with
`sampler import-parquet --add-reverse`."""
import glob
import os
import subprocess
import sys
import zipfile


def tables(into):
    """Writes movie.parquet, actors.parquet, directors.parquet,
    acted_in.parquet and directed_in.parquet into `into`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wheels = glob.glob(".cache/wheels/graphdatascience-2.2-*.whl")
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "graphdatascience==2.2", "-d", ".cache/wheels"], check=True)
        wheels = glob.glob(".cache/wheels/graphdatascience-2.2-*.whl")
    os.makedirs(into, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as z:
        def read(name):
            return pq.read_table(z.open(f"graphdatascience/resources/imdb/imdb_{name}.parquet.gzip"))
        cols = ["nodeId", "plot_keywords"]
        labeled = read("movies_with_genre").select(cols + ["genre"])
        rest = read("movies_without_genre").select(cols)
        rest = rest.append_column("genre", pa.nulls(rest.num_rows, pa.int64()))
        pq.write_table(pa.concat_tables([labeled, rest]), f"{into}/movie.parquet")
        for name in ("actors", "directors", "acted_in", "directed_in"):
            pq.write_table(read(name), f"{into}/{name}.parquet")


def dataset(sampler, ds, work):
    """Imports IMDB into `ds` with the `sampler` binary, its tables in
    `work`, unless it is there."""
    if os.path.exists(f"{ds}/metadata.yaml"):
        return
    tables(work)
    subprocess.run(
        [sampler, "import-parquet", "--out", ds, "--target-type", "movie",
         "--nodes", f"movie={work}/movie.parquet", "--nodes", f"actor={work}/actors.parquet",
         "--nodes", f"director={work}/directors.parquet",
         "--edges", f"actor:acted_in:movie={work}/acted_in.parquet",
         "--edges", f"director:directed_in:movie={work}/directed_in.parquet", "--add-reverse",
         "--id-column", "nodeId", "--features-column", "plot_keywords", "--label-column", "genre",
         "--source-column", "sourceNodeId", "--target-column", "targetNodeId", "--overwrite"],
        check=True, capture_output=True)
