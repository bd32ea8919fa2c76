"""A read-only HTTP file server with byte ranges, as object hosts (nginx,
CDNs, S3 websites) serve them, for the end-to-end test of http:// locations.
Serves the current directory on 127.0.0.1 at a free port and prints
"port N" once listening. Python's own http.server has no Range support."""

import http.server
import os
import re
import sys


class Handler(http.server.SimpleHTTPRequestHandler):
    def send_head(self):
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        size = os.path.getsize(path)
        f = open(path, "rb")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m:
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else size - 1
            end = min(end, size - 1)
            if start > end:
                f.close()
                self.send_error(416)
                return None
            f.seek(start)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(end - start + 1))
            self.remaining = end - start + 1
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.remaining = size
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", self.date_time_string(int(os.path.getmtime(path))))
        self.end_headers()
        return f

    def copyfile(self, source, outputfile):
        left = self.remaining
        while left > 0:
            chunk = source.read(min(left, 1 << 20))
            if not chunk:
                break
            outputfile.write(chunk)
            left -= len(chunk)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"port {server.server_address[1]}", flush=True)
sys.stdout.flush()
server.serve_forever()
