#!/bin/bash
cat > /work/Makefile <<'MAKE'
CHAPTERS := $(shell cat chapters.list)

dist/manual.txt: chapters.list $(CHAPTERS:%=chapters/%.txt)
	mkdir -p dist
	cat $(CHAPTERS:%=chapters/%.txt) > $@

clean:
	rm -rf dist
MAKE
cd /work && make
