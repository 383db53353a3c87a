#!/usr/bin/python3
# Prints the shuffle permutations stored in loader_test.cpp:
#   /usr/bin/python3 tests/unit/data/shuffle_reference.py
# The shuffle recipe documented in runtime/data/loader.cpp, reimplemented independently.
M=(1<<64)-1
G=0x9E3779B97F4A7C15
def mix(z):
    z=((z^(z>>30))*0xBF58476D1CE4E5B9)&M
    z=((z^(z>>27))*0x94D049BB133111EB)&M
    return z^(z>>31)
def perm(seed, epoch, count):
    st=[mix(seed)^mix((epoch+G)&M)]
    def nxt():
        st[0]=(st[0]+G)&M; return mix(st[0])
    def below(b):
        th=((1<<64)-b)%b
        while True:
            r=nxt()
            if r>=th: return r%b
    a=list(range(count))
    for i in range(count-1,0,-1):
        j=below(i+1); a[i],a[j]=a[j],a[i]
    return a
print(perm(1337,0,10)); print(perm(1337,1,10)); print(perm(0,0,7))
