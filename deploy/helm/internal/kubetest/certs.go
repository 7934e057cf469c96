package kubetest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certLifetime bounds every certificate the harness issues: long enough for
// any test, short enough that a leaked key is worthless soon.
const certLifetime = 24 * time.Hour

// CA is the cluster's certificate authority, generated for one test. Every
// component's serving certificate and every client certificate is issued
// by it, and every component trusts it (--client-ca-file, --root-ca-file,
// the kubeconfigs' certificate-authority).
type CA struct {
	// CertFile is the PEM file of the CA certificate.
	CertFile string
	// KeyFile is the PEM (PKCS #8) file of its private key; the
	// controller-manager signs CertificateSigningRequests with it.
	KeyFile string

	cert *x509.Certificate
	key  crypto.Signer
	dir  string
}

// KeyPair names the PEM files of one issued certificate and its key.
type KeyPair struct {
	CertFile, KeyFile string
}

// newCA generates a CA whose files are written into dir.
func newCA(dir string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("kubetest: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "retryd-kubetest-ca"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(certLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("kubetest: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{cert: cert, key: key, dir: dir,
		CertFile: filepath.Join(dir, "ca.crt"), KeyFile: filepath.Join(dir, "ca.key")}
	if err := writeCert(ca.CertFile, der); err != nil {
		return nil, err
	}
	if err := writeKey(ca.KeyFile, key); err != nil {
		return nil, err
	}
	return ca, nil
}

// Issue issues a certificate signed by the CA and writes it and a new key
// into the CA's directory as name.crt and name.key. cn and orgs are the
// subject's common name and organizations, which the API server reads as
// the user name and groups of a client certificate (e.g. "system:node:n1",
// "system:nodes"); hosts are the DNS names and IP addresses a serving
// certificate is valid for. With hosts the certificate is for serving and
// for clients; without, for clients only.
func (ca *CA) Issue(name, cn string, orgs []string, hosts ...string) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("kubetest: key for %s: %w", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(certLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("kubetest: certificate for %s: %w", name, err)
	}
	kp := KeyPair{CertFile: filepath.Join(ca.dir, name+".crt"), KeyFile: filepath.Join(ca.dir, name+".key")}
	if err := writeCert(kp.CertFile, der); err != nil {
		return KeyPair{}, err
	}
	if err := writeKey(kp.KeyFile, key); err != nil {
		return KeyPair{}, err
	}
	return kp, nil
}

// CertPool returns a pool holding only the CA's certificate.
func (ca *CA) CertPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// serviceAccountKey writes the key pair that signs and verifies service
// account tokens: the private key for the API server's
// --service-account-signing-key-file and the controller-manager's
// --service-account-private-key-file, the public key for
// --service-account-key-file.
func serviceAccountKey(dir string) (private, public string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("kubetest: service account key: %w", err)
	}
	private, public = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writeKey(private, key); err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	return private, public, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

func writeCert(path string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}
